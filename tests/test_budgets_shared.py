"""A spend budget shared by three instances on one real PostgreSQL: each admission is decided in the
store's transaction against what every instance spent and still reserves, and reserved in it, so
together the instances pass the limit by at most one call each (the documented bound), burst after
burst.  Three gates, each with its own store connections, usage recorder (its half-second batches as
the daemon's) and model client, as three daemons would have, against one fake model server."""

from __future__ import annotations

import asyncio

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
