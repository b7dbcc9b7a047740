"""An event the gateway fails on again and again is set aside as a dead letter; the chat moves on.

Each platform's real library and our adapter run against its fake server and
the real gateway.  The failure is real too: state.db gets a trigger that
refuses any message containing POISON (as a store that cannot take one message
would), so handling that event raises every time, whatever the platform.
After the third failure the event is in ``dead_letters`` with its payload
masked (no token anywhere in the row), the platform's offset or ack has moved
on, and the next message in the same chat is answered.  Once the store takes
the message again, ``switchboard deadletters retry`` has the running daemon
replay it and the user gets the answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from contextlib import closing

import aiohttp
import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.runtime.daemon import Gateway
from gateway.types import FailedEvents
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import DEFAULT_TOKEN as TELEGRAM_TOKEN, FakeTelegram
from tests.harness import eventually, gateway_config

ANN = FakeTelegram.user(111, "Ann")
# A token pasted into the message: it must not survive in the dead letter either.
POISON = f"POISON please keep {TELEGRAM_TOKEN} safe"


def refuse_poison(db_path) -> None:
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TRIGGER refuse_poison BEFORE INSERT ON messages WHEN NEW.content LIKE '%POISON%' "
                     "BEGIN SELECT RAISE(ABORT, 'the store refused this message'); END")
        conn.commit()


def accept_poison(db_path) -> None:
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute("DROP TRIGGER refuse_poison")
        conn.commit()


def dead_letters(db_path) -> list[dict]:
    with closing(sqlite3.connect(db_path)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM dead_letters ORDER BY id")]


async def one_dead_letter(gw: Gateway, platform: str) -> dict:
    [row] = await eventually(lambda: dead_letters(gw.config.db_path), timeout=20, what="a dead letter")
    assert (row["platform"], row["status"], row["attempts"]) == (platform, "held", 3)
    assert "the store refused this message" in row["error"]
    for column in ("payload", "message", "error"):
        assert TELEGRAM_TOKEN not in (row[column] or ""), column
    assert "POISON please keep *** safe" in row["payload"]
    assert json.loads(row["message"])["text"] == "POISON please keep *** safe"
    return row


async def until_shown(gw: Gateway, held: int, timeout: float = 10) -> None:
    """Until GET /healthz and GET /metrics on the local API both show ``held`` dead letters."""
    base = f"http://127.0.0.1:{gw.api.bound_port}"
    seen = {}
    async with aiohttp.ClientSession() as http:

        async def shown() -> bool:
            async with http.get(f"{base}/healthz") as resp:
                seen["health"] = (await resp.json())["dead_letters"]
            async with http.get(f"{base}/metrics") as resp:
                seen["gauge"] = re.search(r"^switchboard_dead_letters (\S+)$", await resp.text(), re.M).group(1)
            return (seen["health"], float(seen["gauge"])) == (held, held)

        await eventually(shown, timeout, lambda: f"/healthz to show {held} dead letters; /healthz shows "
                         f"{seen.get('health')} and /metrics {seen.get('gauge')}", every=0.05)


async def cli(*args: str) -> str:
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


# -- Telegram -------------------------------------------------------------------------------------


@pytest.fixture
async def telegram(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            refuse_poison(config.db_path)
            yield tg, gw
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_telegram_update_failing_three_times_is_set_aside_and_the_chat_moves_on(telegram):
    tg, gw = telegram
    poison = tg.dm(ANN, POISON)
    after = tg.dm(ANN, "next")  # the same chat, behind the poison update: it used to wait forever
    [reply] = await tg.wait_for_sent(1, timeout=20)
    assert reply.visible_text.startswith("echo: next | turns: 1")
    await tg.wait_until_confirmed(after)
    row = await one_dead_letter(gw, "telegram")
    assert row["event_id"] == str(poison["update_id"])
    assert json.loads(row["payload"])["message"]["chat"]["id"] == 111
    await until_shown(gw, 1)


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
async def test_an_operator_replays_a_dead_letter_once_the_fault_is_fixed(telegram, monkeypatch):
    tg, gw = telegram
    monkeypatch.setenv("SWITCHBOARD_HOME", str(gw.config.home))
    tg.dm(ANN, POISON)
    row = await one_dead_letter(gw, "telegram")
    accept_poison(gw.config.db_path)
    out = await cli("deadletters", "retry", str(row["id"]))
    assert f"dead letter {row['id']} is marked for retry" in out
    [reply] = await tg.wait_for_sent(1, timeout=20)
    assert reply.visible_text.startswith("echo: POISON please keep ")  # the token masked: "***" renders as Markdown
    await eventually(lambda: dead_letters(gw.config.db_path)[0]["status"] == "retried", what="retried")
    await until_shown(gw, 0)


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
async def test_a_replay_that_fails_again_is_held_again_with_the_new_error(telegram, monkeypatch):
    tg, gw = telegram
    monkeypatch.setenv("SWITCHBOARD_HOME", str(gw.config.home))
    tg.dm(ANN, POISON)
    row = await one_dead_letter(gw, "telegram")
    await cli("deadletters", "retry", str(row["id"]))  # the fault is still there
    again = await eventually(lambda: (r := dead_letters(gw.config.db_path)[0])["attempts"] == 4 and r,
                             timeout=10, what="the failed replay recorded")
    assert again["status"] == "held" and "the store refused this message" in again["error"]
    assert tg.sent == []


async def test_a_telegram_webhook_update_failing_three_times_is_answered_200_and_set_aside(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url, "webhook_url": "https://bot.example.com/tg",
                                    "webhook_port": 0, "webhook_secret": "hook_secret_1"}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            refuse_poison(config.db_path)
            url = gw.adapters["telegram"].webhook_local_url
            chat = FakeTelegram.private_chat(ANN)
            poison = {"update_id": 7, "message": tg.message(chat, ANN, POISON)}
            # Telegram delivers again after each non-2xx answer; the third failure sets it aside.
            assert [await tg.deliver_webhook(poison, url) for _ in range(3)] == [500, 500, 200]
            assert await tg.deliver_webhook({"update_id": 8, "message": tg.message(chat, ANN, "next")}, url) == 200
            [reply] = await tg.wait_for_sent(1, timeout=10)
            assert reply.visible_text.startswith("echo: next")
            row = await one_dead_letter(gw, "telegram")
            assert row["event_id"] == "7"
        finally:
            await gw.stop(grace_seconds=5)


# -- Discord ---------------------------------------------------------------------------------------


async def test_a_discord_message_failing_three_times_is_set_aside_and_the_chat_moves_on(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": [f"discord:{dc.alice['id']}"]},
            platforms={"discord": {"token": dc.token, "api_base_url": dc.api_base_url, "gateway_url": dc.gateway_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            refuse_poison(config.db_path)
            poison = await dc.dm(dc.alice, POISON)
            row = await one_dead_letter(gw, "discord")  # Discord never redelivers: retried in-process
            assert row["event_id"] == poison["id"]
            assert json.loads(row["payload"])["author"]["id"] == dc.alice["id"]
            await dc.dm(dc.alice, "next")
            [reply] = await dc.wait_for_sent(1, timeout=10)
            assert reply["content"].startswith("echo: next | turns: 1")
        finally:
            await gw.stop(grace_seconds=5)


# -- Slack -----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_a_slack_event_failing_three_times_is_acknowledged_and_set_aside(tmp_path, caplog):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                 "api_base_url": slack.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", timeout=10)
            await slack.wait_connected()
            refuse_poison(config.db_path)
            event = slack.message("D1", "U1", POISON)
            envelopes = []
            for attempt in range(3):  # Slack redelivers an envelope that was not acknowledged, same event id
                envelopes.append(await slack.send_event(event, event_id="EvPOISON", retry_attempt=attempt))
                if attempt < 2:
                    await eventually(lambda: caplog.text.count("Slack will redeliver") == attempt + 1, timeout=10,  # noqa: B023 - called within this iteration
                                     what=f"failure {attempt + 1}")
            await slack.wait_for_ack(envelopes[2], timeout=10)
            assert not slack.acked(envelopes[0]) and not slack.acked(envelopes[1])
            row = await one_dead_letter(gw, "slack")
            assert row["event_id"] == "EvPOISON"
            payload = json.loads(row["payload"])
            assert payload["event"]["ts"] == event["ts"] and payload["token"] == "***"
            await slack.send_event(slack.message("D1", "U1", "next"))
            [reply] = await slack.wait_for_sent(1, timeout=10)
            assert reply["text"].startswith("echo: next | turns: 1")
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_slack_http_event_failing_three_times_is_answered_200_and_set_aside(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "signing_secret": slack.signing_secret, "mode": "http",
                                 "http_port": 0, "api_base_url": slack.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", timeout=10)
            refuse_poison(config.db_path)
            url = f"http://127.0.0.1:{gw.adapters['slack'].http_port}/slack/events"
            event = slack.message("D1", "U1", POISON)
            statuses = [(await slack.post_event(url, event, event_id="EvHTTP", retry_num=n or None))[0] for n in range(3)]
            assert statuses[:2] != [200, 200] and all(s >= 500 for s in statuses[:2]) and statuses[2] == 200
            assert (await slack.post_event(url, slack.message("D1", "U1", "next")))[0] == 200
            [reply] = await slack.wait_for_sent(1, timeout=10)
            assert reply["text"].startswith("echo: next")
            assert (await one_dead_letter(gw, "slack"))["event_id"] == "EvHTTP"
        finally:
            await gw.stop(grace_seconds=5)


# -- the adapters' counter ---------------------------------------------------------------------------


async def test_failures_are_counted_per_event_in_bounded_memory_and_a_failed_store_keeps_the_event():
    stored = []

    async def store(platform, event_id, payload, message, error):
        if event_id == "full-disk":
            raise OSError("No space left on device")
        stored.append((platform, event_id, payload, message, error))

    failed = FailedEvents("telegram", store, memory=2)
    boom = RuntimeError("boom")
    assert [await failed.give_up("1", {"n": 1}, None, boom) for _ in range(3)] == [False, False, True]
    assert stored == [("telegram", "1", {"n": 1}, None, "RuntimeError: boom")]
    assert await failed.give_up("1", {}, None, boom) is False  # set aside: a new delivery starts counting afresh
    failed.failed("2")
    failed.failed("3")  # three events in a memory of two: "1", the oldest, is forgotten
    assert failed.failed("1") == 1
    assert [await failed.give_up("full-disk", {}, None, boom) for _ in range(4)] == [False] * 4  # never acknowledged
    assert await FailedEvents("slack", None).set_aside("x", {}, None, boom) is False  # no store: nothing set aside
