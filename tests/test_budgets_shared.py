"""A spend budget shared by three instances on one real PostgreSQL: each admission is decided in the
store's transaction against what every instance spent and still reserves, and reserved in it, so
together the instances pass the limit by at most one call each (the documented bound), burst after
burst.  Three gates, each with its own store connections, usage recorder (its half-second batches as
the daemon's) and model client, as three daemons would have, against one fake model server."""

from __future__ import annotations

import asyncio
import time

import psycopg

from gateway.budgetgate import BudgetGate, BudgetSettings
from gateway.budgets import Rule, period_key
from gateway.errors import BudgetExceeded
from gateway.model import ModelClient, ModelSettings
from gateway.usage import CallContext, UsageRecorder
from state import AsyncSessionDB
from tests.fakes.model_server import FakeModel

LIMIT = 1_500
BURSTS = 10
CALLS = 30  # at once in each burst, spread over the instances
INSTANCES = 3


async def _instance(url: str, model: FakeModel, rules: list[Rule]):
    db = await AsyncSessionDB.open(url)
    gate = BudgetGate(BudgetSettings(rules=tuple(rules)), db)
    await gate.refresh()
    usage = UsageRecorder(db, {}, budgets=gate)  # batches of half a second, as in the daemon
    client = ModelClient(ModelSettings(base_url=model.base_url, api_key="k", name="fake-model"), usage=usage,
                         budgets=gate)
    return db, gate, usage, client


async def _call(client: ModelClient, i: int, ctx: CallContext, made: list[int]) -> None:
    try:
        await client.complete([{"role": "user", "content": f"question {i} " + "y" * 400}], purpose=ctx)
        made[0] += 1
    except BudgetExceeded:
        pass


async def test_three_instances_on_one_postgresql_overshoot_a_shared_budget_by_at_most_one_call_each(pg_url):
    users = [f"burst{b}" for b in range(BURSTS)]
    async with FakeModel(delay=0.05) as model:
        rules = [Rule(f"user:api:{u}", "day", "tokens", LIMIT) for u in users]
        instances = [await _instance(pg_url, model, rules) for _ in range(INSTANCES)]
        overshoots, admitted = [], []
        try:
            for user in users:
                ctx = CallContext("turn", None, "api", user, user)
                made = [0]
                await asyncio.wait_for(asyncio.gather(*(_call(instances[i % INSTANCES][3], i, ctx, made)
                                                        for i in range(CALLS))), 120)
                for _, _, usage, _ in instances:
                    await usage.drain()
                db = instances[0][0]
                rows = [r for r in await db.usage.calls(0, limit=100_000) if r["user_id"] == user]
                sizes = [r["prompt_tokens"] + r["completion_tokens"] for r in rows]
                day = period_key("day", instances[0][1].clock(), instances[0][1].settings.tz)
                (_, spent), = (await db.budgets.spent([f"user:api:{user}"], [day])).values()
                assert spent == sum(sizes), "the roll-up holds what the ledger holds"
                assert spent >= LIMIT - max(sizes), f"{user}: the budget was used up ({spent} of {LIMIT})"
                assert spent <= LIMIT + INSTANCES * max(sizes), \
                    f"{user}: {spent} tokens spent against {LIMIT}, calls of up to {max(sizes)} tokens"
                assert made[0] == len(rows) < CALLS, "the rest were refused, never sent"
                overshoots.append(spent - LIMIT)
                admitted.append(made[0])
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                left = await (await conn.execute("SELECT COUNT(*) FROM budget_reservations")).fetchone()
            assert left == (0,), "every reservation went with its call's ledger row"
        finally:
            for db, gate, usage, client in instances:
                await usage.drain()
                await client.close()
                await gate.close()
                await db.close()
    print(f"\n{INSTANCES} instances, {CALLS} calls a burst, limit {LIMIT}: admitted {admitted}, "
          f"overshoot per burst {overshoots} tokens")


async def test_a_rule_raised_or_a_spend_reset_elsewhere_reaches_every_instance_within_10_seconds(pg_url):
    """What `switchboard budgets set` and `reset` write (from another process) is what each instance's
    next check uses within 10 s, read before the decision, with no call of its own to trigger it."""
    async with FakeModel() as model:
        rules = [Rule("user:api:ann", "day", "tokens", 100)]
        instances = [await _instance(pg_url, model, rules) for _ in range(2)]
        ctx = CallContext("turn", None, "api", "ann", "ann")
        loop = asyncio.get_running_loop()
        try:
            db, gate = instances[0][0], instances[0][1]
            day = period_key("day", gate.clock(), gate.settings.tz)
            await db.budgets.record_calls([], [("user:api:ann", day, 0.0, 100)])  # another instance's calls
            checks = [inst[1] for inst in instances]

            async def allowed_everywhere() -> bool:
                return all([(await g.check(ctx)).allowed for g in checks])

            await db.budgets.set_rule("user:api:ann/day/tokens", "user:api:ann", "day", "tokens", 1_000,
                                      now=time.time())
            started = loop.time()
            while not await allowed_everywhere():
                assert loop.time() - started <= 10, "the raised rule reached every instance within 10 s"
                await asyncio.sleep(0.2)
            await db.budgets.record_calls([], [("user:api:ann", day, 0.0, 1_000)])
            for g in checks:
                await g.refresh()
            assert not any([(await g.check(ctx)).allowed for g in checks])
            await db.budgets.reset("user:api:ann", day)
            started = loop.time()
            while not await allowed_everywhere():
                assert loop.time() - started <= 10, "the reset reached every instance within 10 s"
                await asyncio.sleep(0.2)
        finally:
            for db, gate, _, client in instances:
                await client.close()
                await gate.close()
                await db.close()
