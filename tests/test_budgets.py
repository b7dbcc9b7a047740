"""Spend budgets: the decision (gateway/budgets.py), the config's rules, and the store's roll-up.

The store tests run on SQLite and PostgreSQL (``store_target``).  Calls go through the real
:class:`gateway.model.ModelClient` and its usage recorder against the fake model server
(tests/fakes/model_server.py), so what a budget sees is what the ledger recorded.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from zoneinfo import ZoneInfo

import pytest

import state
from gateway.budgetgate import BudgetGate, BudgetSettings
from gateway.budgets import Price, Rule, RuleState, call_scopes, decide, period_end, period_key, refusal_line
from gateway.config import config_from_dict
from gateway.errors import BudgetExceeded, ConfigError
from gateway.model import ModelClient, ModelSettings
from gateway.usage import CallContext, UsageRecorder, for_session
from tests.fakes.model_server import FakeModel

TOKYO = ZoneInfo("Asia/Tokyo")
PRICE = Price(input=1.0, output=10.0)  # dollars per million tokens


def _state(kind: str, limit: float, used: float, period: str = "day") -> RuleState:
    return RuleState(Rule("user:ann", period, kind, limit), "d:2026-11-27", used, 1_000_000.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the decision


def test_a_spent_budget_refuses_and_says_when_it_resets():
    verdict = decide([_state("tokens", 1000, 1000)], prompt_tokens=10, price=PRICE)
    assert not verdict.allowed and verdict.refused is not None and verdict.refused.rule.kind == "tokens"


def test_the_answer_is_capped_at_what_the_tightest_rule_still_allows():
    verdict = decide([_state("tokens", 1000, 850), _state("cost", 1.0, 0.999)], prompt_tokens=50, price=PRICE,
                     asked_max_tokens=4096)
    # tokens: 150 left; cost: $0.001 left at $10 per million output tokens = 100 tokens
    assert verdict.allowed and verdict.max_tokens == 100
    assert [s.rule.kind for s in verdict.near] == ["tokens", "cost"], "both at 80 % or more"
    assert decide([_state("tokens", 1000, 10)], prompt_tokens=5, price=PRICE, asked_max_tokens=50).max_tokens == 50
    assert decide([], prompt_tokens=5, price=PRICE).max_tokens is None


def test_periods_follow_the_configured_timezone():
    before_midnight = dt.datetime(2026, 11, 27, 23, 59, 30, tzinfo=TOKYO).timestamp()
    assert period_key("day", before_midnight, TOKYO) == "d:2026-11-27"
    assert period_key("day", before_midnight + 60, TOKYO) == "d:2026-11-28"
    assert period_key("day", before_midnight, ZoneInfo("UTC")) == "d:2026-11-27"
    assert period_end("day", before_midnight, TOKYO) == before_midnight + 30
    assert period_end("month", before_midnight, TOKYO) == dt.datetime(2026, 12, 1, tzinfo=TOKYO).timestamp()
    assert period_key("month", dt.datetime(2026, 12, 31, 23, 0, tzinfo=TOKYO).timestamp(), TOKYO) == "m:2026-12"
    line = refusal_line(RuleState(Rule("user:ann", "day", "cost", 2.0), "d:2026-11-27", 2.0,
                                  period_end("day", before_midnight, TOKYO)), TOKYO, before_midnight)
    assert line.startswith("Your daily budget is used up; it resets tomorrow at 00:00 (Asia/Tokyo).")


def test_a_call_counts_against_the_identity_its_account_is_linked_to():
    owners = {"telegram:1": "ann", "slack:U2": "ann"}
    assert call_scopes("telegram", "1", "1", owners) == ("gateway", "platform:telegram", "user:ann", "chat:telegram:1")
    assert call_scopes("slack", "U2", "C9", owners)[2] == "user:ann"
    assert call_scopes("slack", "U3", "C9", owners)[2] == "user:slack:U3"
    assert call_scopes("cron", "digest", "digest", owners) == ("gateway", "platform:cron", "cron:digest")


# --------------------------------------------------------------------------- the config


def _config(tmp_path, **budgets):
    return config_from_dict({"home": str(tmp_path), "identities": {"ann": ["telegram:1", "slack:U2"]},
                             "cron": {"jobs": [{"id": "digest", "schedule": "every 1h", "prompt": "p",
                                                "deliver": "local"}]},
                             "budgets": budgets})


def test_config_rules_are_checked_and_an_account_of_an_identity_means_the_identity(tmp_path):
    cfg = _config(tmp_path, rules=[{"scope": "user:slack:U2", "period": "month", "cost": 5},
                                   {"scope": "cron:digest", "tokens": 1000}, {"scope": "gateway", "cost": 50},
                                   {"scope": "chat:telegram:-100", "tokens": 10}, {"scope": "platform:slack", "cost": 1}],
                  notify="telegram:-100999", default_price={"input": 1, "output": 2})
    from gateway.budgetgate import settings_from_config

    settings = settings_from_config(cfg)
    assert [r.name for r in settings.rules] == ["user:ann/month/cost", "cron:digest/day/tokens", "gateway/day/cost",
                                                "chat:telegram:-100/day/tokens", "platform:slack/day/cost"]
    assert settings.default_price == Price(1.0, 2.0, None, priced=False)


@pytest.mark.parametrize(("budgets", "key", "words"), [
    ({"rules": [{"scope": "user:bob", "cost": 1}]}, "budgets.rules[0].scope", "neither a name under identities"),
    ({"rules": [{"scope": "cron:nightly", "cost": 1}]}, "budgets.rules[0].scope", "not a job under cron.jobs"),
    ({"rules": [{"scope": "platform:irc", "cost": 1}]}, "budgets.rules[0].scope", "is not a platform"),
    ({"rules": [{"scope": "team:x", "cost": 1}]}, "budgets.rules[0].scope", "a scope starts with one of"),
    ({"rules": [{"scope": "gateway"}]}, "budgets.rules[0]", "one limit"),
    ({"rules": [{"scope": "gateway", "cost": 1, "tokens": 5}]}, "budgets.rules[0]", "one limit"),
    ({"rules": [{"scope": "gateway", "cost": -1}]}, "budgets.rules[0].cost", "greater than 0"),
    ({"rules": [{"scope": "gateway", "cost": 1, "period": "week"}]}, "budgets.rules[0].period", "day"),
    ({"rules": [{"scope": "user:ann", "cost": 1}, {"scope": "user:telegram:1", "cost": 2}]}, "budgets.rules[1]",
     "already budgets.rules[0]"),
    ({"notify": "somewhere"}, "budgets.notify", "platform:chat_id"),
])
def test_a_bad_rule_is_a_config_error_naming_its_key(tmp_path, budgets, key, words):
    with pytest.raises(ConfigError) as raised:
        _config(tmp_path, **budgets)
    assert raised.value.exit_code == 78
    assert key in str(raised.value) and words in str(raised.value)


# --------------------------------------------------------------------------- on the store, through real calls


UTC = ZoneInfo("UTC")


async def _gate(target, rules, *, tz=UTC, owners=None, default_price=None, pricing=None):
    db = await state.AsyncSessionDB.open(target)
    gate = BudgetGate(BudgetSettings(rules=tuple(rules), tz=tz, owners=owners or {}, pricing=pricing or {},
                                     default_price=default_price), db)
    await gate.refresh()
    return db, gate


def _client(model: FakeModel, db, gate, pricing=None) -> tuple[ModelClient, UsageRecorder]:
    usage = UsageRecorder(db, pricing or {}, batch_seconds=0.0, budgets=gate)
    return ModelClient(ModelSettings(base_url=model.base_url, api_key="k", name="fake-model"), usage=usage,
                       budgets=gate), usage


async def test_every_call_is_checked_and_its_answer_capped_then_refused_once_spent(store_target):
    async with FakeModel() as model:
        db, gate = await _gate(store_target, [Rule("user:telegram:7", "day", "tokens", 200)])
        client, usage = _client(model, db, gate)
        ctx = CallContext("turn", None, "telegram", "7", "7")
        try:
            made = 0
            with pytest.raises(BudgetExceeded) as refused:
                for _ in range(50):
                    await client.complete([{"role": "user", "content": "x" * 200}], purpose=ctx)
                    await usage.drain()
                    made += 1
            assert made >= 2
            sent = [r.body.get("max_tokens") for r in model.requests]
            assert sent == sorted(sent, reverse=True) and sent[-1] < 200, "capped at what is left, lower each time"
            assert len(model.requests) == made, "the refused call never reached the model"
            spent = await db.budgets.spent(["user:telegram:7"], [period_key("day", gate.clock(), gate.settings.tz)])
            total = sum(r["prompt_tokens"] + r["completion_tokens"] for r in await db.usage.calls(0))
            assert list(spent.values())[0][1] == total >= 200, "the roll-up holds exactly what the ledger holds"
            assert "resets" in str(refused.value)
        finally:
            await client.close()
            await db.close()


async def test_internal_calls_count_against_the_user_whose_session_it_is(store_target):
    async with FakeModel() as model:
        db, gate = await _gate(store_target, [Rule("user:ann", "day", "tokens", 10_000)],
                               owners={"telegram:1": "ann"})
        client, usage = _client(model, db, gate)
        try:
            await db.sessions.create("s1", "telegram", user_id="1", session_key="agent:main:telegram:dm:1")
            purposes = ("compression", "recall", "memory_flush", "fact_extraction")
            for purpose in purposes:  # no platform or user given: the session's are used
                await client.complete([{"role": "user", "content": "summarize"}],
                                      purpose=for_session(purpose, "s1", "agent:main:telegram:dm:1"))
            await usage.drain()
            states = await gate.states(("user:ann",))
            total = sum(r["prompt_tokens"] + r["completion_tokens"] for r in await db.usage.calls(0))
            assert states[0].used == total > 0
            assert sorted(r["purpose"] for r in await db.usage.calls(0)) == sorted(purposes)
        finally:
            await client.close()
            await db.close()


async def test_a_model_without_a_price_counts_at_the_default_price(store_target):
    async with FakeModel() as model:
        db, gate = await _gate(store_target, [Rule("gateway", "month", "cost", 1.0)],
                               default_price=Price(1000.0, 1000.0, priced=False))
        client, usage = _client(model, db, gate)
        try:
            await client.complete([{"role": "user", "content": "hello"}], purpose=CallContext("turn", None, "api",
                                                                                              "k", "k"))
            await usage.drain()
            row = (await db.usage.calls(0))[0]
            assert row["cost"] is None, "the ledger says: no price"
            (state_,) = await gate.states(("gateway",))
            assert state_.used == pytest.approx((row["prompt_tokens"] + row["completion_tokens"]) * 1000 / 1e6)
        finally:
            await client.close()
            await db.close()


def test_notices_are_told_once_per_rule_period_and_chat_and_reset_forgets_them(store):
    assert store.budgets.claim_notice("user:ann/day/cost", "d:2026-11-27", "80", "chat-a", now=1.0)
    assert not store.budgets.claim_notice("user:ann/day/cost", "d:2026-11-27", "80", "chat-a", now=2.0)
    assert store.budgets.claim_notice("user:ann/day/cost", "d:2026-11-27", "80", "chat-b", now=2.0)
    assert store.budgets.claim_notice("user:ann/day/cost", "d:2026-11-28", "80", "chat-a", now=3.0)
    store.budgets.record_calls([], [("user:ann", "d:2026-11-27", 1.5, 100), ("user:ann", "d:2026-11-27", 0.5, 50)])
    assert store.budgets.spent(["user:ann"], ["d:2026-11-27"]) == {("user:ann", "d:2026-11-27"): (2.0, 150)}
    assert store.budgets.reset("user:ann", "d:2026-11-27")
    assert store.budgets.spent(["user:ann"], ["d:2026-11-27"]) == {}
    assert store.budgets.claim_notice("user:ann/day/cost", "d:2026-11-27", "80", "chat-a", now=4.0)


def test_rules_set_from_the_cli_are_read_by_what_changed_since(store):
    store.budgets.set_rule("gateway/day/cost", "gateway", "day", "cost", 5.0, now=10.0)
    store.budgets.set_rule("user:ann/day/tokens", "user:ann", "day", "tokens", None, now=20.0)
    assert [r["name"] for r in store.budgets.rules()] == ["gateway/day/cost", "user:ann/day/tokens"]
    assert [r["name"] for r in store.budgets.rules(10.0)] == ["user:ann/day/tokens"]
    store.budgets.set_rule("gateway/day/cost", "gateway", "day", "cost", 7.0, now=30.0)
    assert store.budgets.rules(20.0) == [{"name": "gateway/day/cost", "scope": "gateway", "period": "day",
                                          "kind": "cost", "amount": 7.0, "updated_at": 30.0}]


def test_a_refresh_reads_the_rules_and_the_resets_changed_since_in_one_read_as_each_reads_alone(store):
    store.budgets.set_rule("user:ann/day/tokens", "user:ann", "day", "tokens", None, now=20.0)
    store.budgets.set_rule("gateway/day/cost", "gateway", "day", "cost", 5.0, now=20.0)
    store.budgets.set_rule("user:bob/day/cost", "user:bob", "day", "cost", 1.5, now=10.0)
    store.budgets.reset("user:ann", "d:2026-11-28", now=40.0)
    store.budgets.reset("user:ann", "d:2026-11-27", now=30.0)
    for rules_since, resets_since in ((-1.0, -1.0), (10.0, 30.0), (20.0, -1.0), (-1.0, 40.0)):
        assert store.budgets.changes(rules_since, resets_since) == (
            store.budgets.rules(rules_since), store.budgets.resets(resets_since))
    rules, resets = store.budgets.changes(-1.0, -1.0)
    assert [r["name"] for r in rules] == ["user:bob/day/cost", "gateway/day/cost", "user:ann/day/tokens"]
    assert rules[0] == {"name": "user:bob/day/cost", "scope": "user:bob", "period": "day", "kind": "cost",
                        "amount": 1.5, "updated_at": 10.0}
    assert resets == [("user:ann", "d:2026-11-27", 30.0), ("user:ann", "d:2026-11-28", 40.0)]


async def test_three_instances_on_one_budget_overshoot_by_at_most_one_call_each(pg_url):
    """Three gates, each with its own store connection and model client (as three daemons would have),
    call concurrently until refused; together they pass the limit by at most one call each."""
    limit = 3000
    async with FakeModel(delay=0.02) as model:
        instances = [await _gate(pg_url, [Rule("gateway", "day", "tokens", limit)]) for _ in range(3)]
        clients = [_client(model, db, gate) for db, gate in instances]
        largest = [0]

        async def keep_calling(client: ModelClient, usage: UsageRecorder) -> None:
            ctx = CallContext("turn", None, "api", "k", "k")
            while True:
                try:
                    done = await client.complete([{"role": "user", "content": "y" * 400}], purpose=ctx)
                except BudgetExceeded:
                    return
                largest[0] = max(largest[0], done.prompt_tokens + done.completion_tokens)
                await usage.drain()

        try:
            await asyncio.wait_for(asyncio.gather(*(keep_calling(c, u) for c, u in clients)), 60)
            db = instances[0][0]
            total = sum(r["prompt_tokens"] + r["completion_tokens"] for r in await db.usage.calls(0))
            assert total >= limit, "the budget was used up"
            assert total <= limit + 3 * largest[0], f"{total} tokens spent against a limit of {limit}"
            assert len(model.requests) > 3
        finally:
            for (client, _), (db, _) in zip(clients, instances, strict=True):
                await client.close()
                await db.close()


def test_spends_of_periods_long_over_are_pruned(store):
    store.budgets.record_calls([], [("user:ann", "d:2026-09-01", 1.0, 10), ("user:ann", "d:2026-11-27", 1.0, 10),
                                    ("user:ann", "m:2025-01", 1.0, 10), ("user:ann", "m:2026-11", 1.0, 10)])
    store.budgets.claim_notice("user:ann/day/cost", "d:2026-09-01", "80", "chat", now=1.0)
    assert store.budgets.prune("d:2026-10-18", "m:2025-10") == 2
    assert sorted(store.budgets.spent(["user:ann"], ["d:2026-09-01", "d:2026-11-27", "m:2025-01", "m:2026-11"])) == \
        [("user:ann", "d:2026-11-27"), ("user:ann", "m:2026-11")]
    assert store.budgets.claim_notice("user:ann/day/cost", "d:2026-09-01", "80", "chat", now=2.0), "its notice went too"


async def test_calls_under_a_shared_budget_run_side_by_side_and_near_its_end_wait_for_each_other(store_target):
    """A running call holds back its prompt and a part of its answer, not all that is left: the calls of a
    gateway-wide budget still run at once; when what is left is only what running calls hold, the next
    call waits for them instead of being told the budget is used up."""
    async with FakeModel(delay=0.3) as model:
        db, gate = await _gate(store_target, [Rule("gateway", "day", "tokens", 100_000)])
        client, usage = _client(model, db, gate)
        try:
            ctx = CallContext("turn", None, "api", "k", "k")
            await asyncio.gather(*(client.complete([{"role": "user", "content": f"q{i}"}], purpose=ctx)
                                   for i in range(5)))
            assert model.max_in_flight >= 2, "not one at a time"
            await usage.drain()
            day = period_key("day", gate.clock(), gate.settings.tz)
            spent = (await db.budgets.spent(["gateway"], [day]))[("gateway", day)][1]
            await db.budgets.record_calls([], [("gateway", day, 0.0, 100_000 - spent - 1_000)])  # 1,000 left
            await gate.refresh()  # as its refresher does every two seconds: another writer's spend is seen
            model.requests.clear()
            await asyncio.gather(*(client.complete([{"role": "user", "content": f"r{i}"}], purpose=ctx)
                                   for i in range(2)))
            first, second = sorted(model.requests, key=lambda r: r.at)
            assert second.at >= first.answered, "the second waited for the first (all that was left was held)"
            assert first.body["max_tokens"] == 1_000 and second.body["max_tokens"] < 1_000, "then had what was left"
        finally:
            await usage.drain()
            await client.close()
            await db.close()
