"""Spend budgets end to end: python-telegram-bot against the fake Telegram, the fake model server, the
real daemon.  What a user sees: one notice at 80 %, one line at 100 % saying when it resets, messages
kept and answered once the budget allows; the operator told once; /usage showing what is left; a
cron job over its budget skipped and recorded so.

What was spent before the test is put in the budgets' roll-up as the daemon's own calls would have
(``db.budgets.record_calls``), so a test does not need thousands of calls to reach 80 %.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from contextlib import asynccontextmanager

import aiohttp
import pytest
from click.testing import CliRunner

from gateway.budgets import period_key
from gateway.cli.main import main
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, Clock, eventually, gateway_config, running_gateway

ANN = FakeTelegram.user(111, "Ann")
ANN_TOO = FakeTelegram.user(222, "Ann")  # Ann's second account, linked to the same identity
OPERATOR_CHAT = -100999
LIMIT = 10_000


@asynccontextmanager
async def telegram_gateway(tmp_path, clock: Clock, *, timezone: str = "UTC", **overrides):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, timezone=timezone,
            auth={"allowed_users": ["telegram:111", "telegram:222"]},
            identities={"ann": ["telegram:111", "telegram:222"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}}, streaming={"enabled": False},
            budgets={"rules": [{"scope": "user:ann", "period": "day", "tokens": LIMIT}],
                     "notify": f"telegram:{OPERATOR_CHAT}"},
            **overrides,
        )
        gw = Gateway(config, serve_api=True, clock=clock)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            yield tg, model, gw
        finally:
            await gw.stop(grace_seconds=5)


async def spent_before(gw: Gateway, clock: Clock, tokens: int) -> None:
    """What Ann's earlier calls today came to (as the usage recorder writes it)."""
    day = period_key("day", clock(), gw.config.tzinfo)
    await gw.db.budgets.record_calls([], [("user:ann", day, 0.0, tokens)])
    await gw.services.budgets.refresh()  # what the gate's refresher reads within two seconds


def to(tg: FakeTelegram, chat_id: int) -> list[str]:
    return [m.visible_text for m in tg.sent if str(m.chat_id) == str(chat_id)]


async def test_a_user_is_told_at_80_and_at_100_percent_and_their_messages_are_kept_and_answered_later(tmp_path):
    clock = Clock()
    async with telegram_gateway(tmp_path, clock) as (tg, model, gw):
        await spent_before(gw, clock, int(LIMIT * 0.85))
        tg.dm(ANN_TOO, "from the other phone")
        await tg.wait_for(lambda: len(to(tg, 222)) == 2, what="a notice and the answer")
        notice, answer = to(tg, 222)
        assert notice.startswith("Note: 85% of your daily budget is used (8,500 tokens of 10,000 tokens)")
        assert answer.startswith("echo: from the other phone")
        assert model.requests[-1].body["max_tokens"] <= LIMIT - int(LIMIT * 0.85), "capped at what is left"

        tg.dm(ANN_TOO, "again")  # the notice was told: not again this period
        await tg.wait_for(lambda: len(to(tg, 222)) == 3, what="the answer")
        assert to(tg, 222)[-1].startswith("echo: again")

        await spent_before(gw, clock, LIMIT)  # the linked account (111) spent the rest
        calls = len(model.requests)
        tg.dm(ANN, "over budget one")
        await tg.wait_for(lambda: len(to(tg, 111)) == 1, what="the budget line")
        [line] = to(tg, 111)
        assert line.startswith("Your daily budget is used up; it resets ")
        assert "Your message is saved and will be answered then" in line
        tg.dm(ANN, "over budget two")
        key = "agent:main:telegram:dm:111"

        async def held() -> bool:
            return gw.router.held_back(key) == 2 and not gw.router.working_on(key)
        await eventually(held, 10, "both messages held back, the lane idle")
        assert to(tg, 111) == [line], "told once"
        assert len(model.requests) == calls, "no model call over budget"
        stored = [m.content for m in await gw.db.messages.get(await gw.db.routes.get(key)) if m.role == "user"]
        assert stored == ["over budget one", "over budget two"], "a budget never blocks storing a message"

        await tg.wait_for(lambda: len(to(tg, OPERATOR_CHAT)) == 1, what="the operator's notice")
        assert to(tg, OPERATOR_CHAT)[0].startswith("Budget user:ann/day/tokens is used up (")

        tg.dm(ANN, "/usage")
        await tg.wait_for(lambda: len(to(tg, 111)) == 2, what="/usage")
        usage = to(tg, 111)[-1].splitlines()[-1]
        assert usage.startswith("Your daily budget: 0 tokens left of 10,000 tokens (")
        assert usage.endswith("% used), resets tomorrow at 00:00 (UTC)")

        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/metrics") as r:
                metrics = await r.text()
        assert 'switchboard_budget_refusals_total{scope="user"} 2.0' in metrics  # the two messages
        assert 'switchboard_budget_exhausted_total{scope="user"} 1.0' in metrics
        assert 'switchboard_budget_notices_total{scope="user"} 1.0' in metrics

        # the operator resets it (what `switchboard budgets reset user:ann` does): the held messages are
        # answered together, without Ann writing again
        await gw.db.budgets.reset("user:ann", period_key("day", clock(), gw.config.tzinfo))
        await gw.services.budgets.refresh()  # what the gate's refresher reads within two seconds
        await tg.wait_for(lambda: len(to(tg, 111)) == 3, what="the held messages answered")
        assert to(tg, 111)[-1].startswith("echo: over budget two")
        seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
        assert seen[-2:] == ["over budget one", "over budget two"]
        tg.dm(ANN, "after the reset")
        await tg.wait_for(lambda: len(to(tg, 111)) == 4, what="the answer")
        assert to(tg, 111)[-1].startswith("echo: after the reset")
        assert len(to(tg, OPERATOR_CHAT)) == 1, "the operator was told once"


async def test_the_budget_resets_at_midnight_in_the_configured_timezone(tmp_path):
    clock = Clock()
    # no session resets: the jump to midnight below passes 04:00 in Tokyo when the test runs between 15:00 and
    # 19:00 UTC, and the answer would then come after a new session's notice (a reset, not the budget, at work)
    async with telegram_gateway(tmp_path, clock, timezone="Asia/Tokyo", sessions={"reset": {"mode": "none"}}) as (
            tg, model, gw):
        await spent_before(gw, clock, LIMIT)
        tg.dm(ANN, "late at night")
        await tg.wait_for(lambda: len(to(tg, 111)) == 1, what="the budget line")
        assert "resets tomorrow at 00:00 (Asia/Tokyo)" in to(tg, 111)[0]
        assert not model.requests
        tokyo = gw.config.tzinfo
        now = dt.datetime.fromtimestamp(clock(), tokyo)
        midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tokyo).timestamp()
        clock.advance(midnight - clock() + 1)  # one second into the next day in Tokyo
        tg.dm(ANN, "good morning")
        await tg.wait_for(lambda: len(to(tg, 111)) == 2, what="the answer")
        assert to(tg, 111)[-1].startswith("echo: good morning")
        assert [m["content"] for m in model.requests[-1].messages if m["role"] == "user"][-2:] == \
            ["late at night", "good morning"]


async def test_a_cron_job_over_its_budget_is_skipped_and_its_history_says_so(tmp_path):
    clock = Clock()
    job = {"id": "digest", "name": "Digest", "schedule": "every 1h", "prompt": "Summarize", "deliver": "local"}
    async with FakeModel() as model, running_gateway(
            tmp_path / "home", model, clock=clock, cron={"jobs": [job]},
            budgets={"rules": [{"scope": "cron:digest", "period": "month", "tokens": 50}]}) as gw:
        first = await gw.cron.run_job("digest")  # under budget: runs, and spends past the 50 tokens
        assert first["status"] == "ok"
        await gw.services.usage.drain()
        second = await gw.cron.run_job("digest")
        assert second["status"] == "skipped" and second["session_id"] is None
        assert second["error"].startswith("over budget: cron:digest/month/tokens is used up until ")
        assert len(model.requests) == 1, "no model call for the skipped run"
    history = CliRunner().invoke(main, ["cron", "history", "digest", "--home", str(tmp_path / "home")])
    assert history.exit_code == 0, history.output
    assert "skipped - over budget: cron:digest/month/tokens is used up" in " ".join(history.output.split())


async def test_a_local_api_request_over_budget_gets_429_saying_when_and_is_stored(tmp_path):
    clock = Clock()
    async with FakeModel() as model, running_gateway(
            tmp_path / "home", model, clock=clock,
            budgets={"rules": [{"scope": "platform:api", "period": "month", "cost": 1.5}]}) as gw:
        api = ApiClient(gw)
        try:
            month = period_key("month", clock(), gw.config.tzinfo)
            await gw.db.budgets.record_calls([], [("platform:api", month, 1.5, 0)])
            await gw.services.budgets.refresh()
            status, text = await api.failure("k", "anything left?")
            assert status == 429
            assert text.startswith("The api platform's monthly budget is used up; it resets on ")
            assert not model.requests
            stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
            assert [m.content for m in stored if m.role == "user"] == ["anything left?"]
        finally:
            await api.close()


async def test_a_tool_loop_call_past_the_budget_is_refused_and_the_message_kept_for_later(tmp_path):
    """The turn's first call is allowed (just under the limit); the tool loop's next call is refused: the
    user gets the budget line, no further call is made, and the message is answered after the reset."""
    clock = Clock()
    async with telegram_gateway(tmp_path, clock) as (tg, model, gw):
        await spent_before(gw, clock, LIMIT - 1)
        model.script(ToolCall("session_search", {"query": "Lyon"}, "call_s"))
        tg.dm(ANN, "what did we say about Lyon?")
        await tg.wait_for(lambda: any("budget is used up" in t for t in to(tg, 111)), what="the budget line")
        assert len(model.requests) == 1, "the tool loop's second call was not made"
        assert model.requests[0].body["max_tokens"] == 1, "the first call was capped at the one token left"
        key = "agent:main:telegram:dm:111"
        await eventually(lambda: gw.router.held_back(key) == 1 and not gw.router.working_on(key), 10, "held")
        await gw.db.budgets.reset("user:ann", period_key("day", clock(), gw.config.tzinfo))
        await gw.services.budgets.refresh()  # what the gate's refresher reads within two seconds
        await tg.wait_for(lambda: to(tg, 111)[-1].startswith("echo: "), what="the held message answered by itself")
        seen = [m["content"] for m in model.requests[-1].messages if m["role"] == "user"]
        assert seen[-1] == "what did we say about Lyon?"


async def test_held_messages_are_answered_by_themselves_once_the_budget_resets(tmp_path):
    clock = Clock()
    async with telegram_gateway(tmp_path, clock) as (tg, model, gw):
        now = dt.datetime.fromtimestamp(clock(), dt.timezone.utc)
        midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.timezone.utc).timestamp()
        clock.advance(midnight - clock() - 2)  # two seconds before midnight (UTC)
        await spent_before(gw, clock, LIMIT)
        tg.dm(ANN, "just before midnight")
        await tg.wait_for(lambda: len(to(tg, 111)) == 1, what="the budget line")
        assert "resets at 00:00 (UTC)" in to(tg, 111)[0] or "resets tomorrow at 00:00 (UTC)" in to(tg, 111)[0]
        # nothing more is sent by Ann: the held message is answered when the new day starts
        await tg.wait_for(lambda: len(to(tg, 111)) == 2, what="the answer after midnight", timeout=15)
        assert to(tg, 111)[1].startswith("echo: just before midnight")
        assert len(model.requests) == 1


@pytest.mark.parametrize("change", [["set", "user:ann", "--tokens", "100000"],
                                    ["set", "user:ann", "--off", "--kind", "tokens"],
                                    ["reset", "user:ann"]], ids=["raised", "off", "reset"])
async def test_held_messages_are_answered_within_10_s_of_a_budget_change_without_writing_again(tmp_path, change):
    """`switchboard budgets set|reset` from another process (the CLI on the same store): the held DM is
    answered by itself, and the dashboard's page shows the rule the gate now uses."""
    clock = Clock()
    async with telegram_gateway(tmp_path, clock, ui={"enabled": True}) as (tg, model, gw):
        await spent_before(gw, clock, LIMIT)
        tg.dm(ANN, "held until the change")
        await tg.wait_for(lambda: len(to(tg, 111)) == 1, what="the budget line")
        assert to(tg, 111)[0].startswith("Your daily budget is used up; it resets ")
        key = "agent:main:telegram:dm:111"
        await eventually(lambda: gw.router.held_back(key) == 1 and not gw.router.working_on(key), 10, "held")
        config = tmp_path / "cli.yaml"  # what the operator's CLI reads: the same home and identities
        config.write_text(json.dumps({"home": str(tmp_path / "home"), "identities": {"ann": ["telegram:111"]},
                                      "budgets": {"rules": [{"scope": "user:ann", "period": "day", "tokens": LIMIT}]}}))
        result = await asyncio.to_thread(CliRunner().invoke, main, ["budgets", *change, "--config", str(config)])
        assert result.exit_code == 0, result.output
        changed_at = asyncio.get_running_loop().time()
        await tg.wait_for(lambda: len(to(tg, 111)) == 2, what="the held message answered", timeout=12)
        took = asyncio.get_running_loop().time() - changed_at
        assert to(tg, 111)[1].startswith("echo: held until the change")
        assert took <= 10, f"answered {took:.1f} s after the change"
        rules = {s.rule.name: s.rule.limit for s in await gw.services.budgets.listing()}
    expected = {"set": {"user:ann/day/tokens": 100_000.0}, "reset": {"user:ann/day/tokens": float(LIMIT)}}
    assert rules == expected.get(change[0] if "--off" not in change else "off", {}), "the rules the gate uses"


async def test_a_local_api_caller_is_told_at_80_percent_in_the_notice_header(tmp_path):
    clock = Clock()
    async with FakeModel() as model, running_gateway(
            tmp_path / "home", model, clock=clock,
            budgets={"rules": [{"scope": "platform:api", "period": "day", "tokens": LIMIT}]}) as gw:
        api = ApiClient(gw)
        try:
            day = period_key("day", clock(), gw.config.tzinfo)
            await gw.db.budgets.record_calls([], [("platform:api", day, 0.0, int(LIMIT * 0.9))])
            await gw.services.budgets.refresh()
            raw = await api.client.chat.completions.with_raw_response.create(
                model="switchboard", messages=[{"role": "user", "content": "how much is left?"}],
                extra_headers={"X-Session-Key": "k"})
            again = await api.client.chat.completions.with_raw_response.create(
                model="switchboard", messages=[{"role": "user", "content": "and now?"}],
                extra_headers={"X-Session-Key": "k"})
        finally:
            await api.close()
    assert raw.headers["X-Switchboard-Notice"].startswith(
        "Note: 90% of the api platform's daily budget is used (9,000 tokens of 10,000 tokens)")
    assert raw.parse().choices[0].message.content.startswith("echo: how much is left?"), "the notice is not the answer"
    assert "X-Switchboard-Notice" not in again.headers, "told once a period"
