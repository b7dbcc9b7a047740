"""The budget check's cost per model call, with 10,000 rules over a 1,000,000-row usage ledger.

    .venv/bin/python bench/budgets.py                       # SQLite in a temporary directory
    .venv/bin/python bench/budgets.py --rows 100000 --calls 2000
    .venv/bin/python bench/budgets.py --pg                  # also PostgreSQL (a throw-away local cluster)

The ledger's rows (10,000 users on 3 platforms and 20,000 chats, the last 30 days) are written
through ``db.budgets.record_calls`` as the daemon's usage recorder writes them: each row with its
spends per scope (gateway, platform, user, chat) and period (the day and the month in the timezone).
The rules: a daily cost rule for each of 9,990 users, a monthly token rule for 8 chats and a
platform, and a monthly cost rule for the gateway: 10,000 in all.

Then ``--calls`` calls of :meth:`gateway.budgetgate.BudgetGate.admit` (and ``release``), each for a
random user's chat, on the daemon's async store: what :class:`gateway.model.ModelClient` runs before
every call (finding the rules of the call's scopes, what they spent this period, deciding and capping
``max_tokens``) with a 20-message prompt.  The gate keeps the spends in memory (read once at its
first refresh, written through with every ledger write): on SQLite a check makes no store read; on
PostgreSQL (``--pg``) an admission is one transaction that locks its scopes' rows, reads what every
instance spent and reserves, and writes its reservation.  Prints p50 and p95 of the whole check's
wall time, of one read of the spends from the roll-up (what a check cost before the gate kept them in
memory), and of its CPU time (the process's, reader thread included: what a busy machine's
scheduling does not inflate), and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _pg
from gateway.budgetgate import BudgetGate, BudgetSettings
from gateway.budgets import Price, Rule, call_scopes, period_key
from gateway.usage import CallContext
from state import AsyncSessionDB, SessionDB

TZ = ZoneInfo("Europe/Berlin")
PLATFORMS = ("telegram", "discord", "slack")
USERS = 10_000
CHATS = 20_000
PROMPT = [{"role": "system", "content": "You are a helpful assistant. " * 20}] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} about the deployment " * 8}
    for i in range(19)]


def rules() -> list[Rule]:
    out = [Rule(f"user:{PLATFORMS[u % 3]}:u{u}", "day", "cost", 5.0) for u in range(USERS - 10)]
    out += [Rule(f"chat:telegram:c{c}", "month", "tokens", 50_000_000) for c in range(8)]
    out += [Rule("platform:slack", "month", "tokens", 10**12), Rule("gateway", "month", "cost", 10**9)]
    return out


def build(target, rows: int, now: float) -> None:
    rng = random.Random(1)
    times = sorted(now - rng.random() * 30 * 86_400 for _ in range(rows))
    owners: dict[str, str] = {}
    with SessionDB(target) as db:
        for start in range(0, rows, 50_000):
            batch, spends = [], []
            for i, at in enumerate(times[start:start + 50_000], start):
                u = i % USERS
                platform, chat = PLATFORMS[u % 3], f"c{i % CHATS}"
                prompt, completion = rng.randint(100, 20_000), rng.randint(10, 800)
                cost = (prompt * 2.0 + completion * 8.0) / 1e6
                batch.append({"at": at, "session_id": None, "platform": platform, "chat_id": chat, "user_id": f"u{u}",
                              "agent": "main", "purpose": "turn", "model": "gpt-4o", "prompt_tokens": prompt,
                              "completion_tokens": completion, "latency_ms": 800.0, "outcome": "ok",
                              "price_input": 2.0, "price_output": 8.0, "price_cached_input": 0.5, "cost": cost})
                for scope in call_scopes(platform, f"u{u}", chat, owners):
                    for period in ("day", "month"):
                        spends.append((scope, period_key(period, at, TZ), cost, prompt + completion))
            db.budgets.record_calls(batch, spends)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def measure(target, calls: int) -> None:
    db = await AsyncSessionDB.open(target)
    gate = BudgetGate(BudgetSettings(rules=tuple(rules()), tz=TZ, pricing={"gpt-4o": Price(2.0, 8.0)}), db)
    started = time.perf_counter()
    await gate.refresh()  # as the daemon does at start: every rule's spends read into memory
    print(f"  the gate's first refresh (every rule's spends read)  {(time.perf_counter() - started) * 1000:.0f} ms")
    rng = random.Random(2)
    whole, reads, cpu = [], [], []
    try:
        for i in range(calls + 50):
            u = rng.randrange(USERS)
            ctx = CallContext("turn", None, PLATFORMS[u % 3], f"c{rng.randrange(CHATS)}", f"u{u}")
            started, cpu_started = time.perf_counter(), time.process_time()
            admission = await gate.admit(ctx, "gpt-4o", PROMPT, 4096)
            gate.release(admission)
            took, used = time.perf_counter() - started, time.process_time() - cpu_started
            scopes = call_scopes(ctx.platform, ctx.user_id, ctx.chat_id, {})
            started = time.perf_counter()
            await db.budgets.spent(list(scopes), [period_key("day", time.time(), TZ), period_key("month", time.time(),
                                                                                                   TZ)])
            read = time.perf_counter() - started
            if i >= 50:  # the first ones warm the reader threads and the page cache
                whole.append(took * 1000)
                reads.append(read * 1000)
                cpu.append(used * 1000)
    finally:
        await gate.close()
        await db.close()
    print(f"  the whole check (admit + release)  p50 {pct(whole, 50):.3f} ms  p95 {pct(whole, 95):.3f} ms")
    print(f"  one read of the spends (roll-up)    p50 {pct(reads, 50):.3f} ms  p95 {pct(reads, 95):.3f} ms  "
          "(not part of a check on SQLite)")
    print(f"  CPU of the whole check (process)     p50 {pct(cpu, 50):.3f} ms  p95 {pct(cpu, 95):.3f} ms  "
          f"(mean {statistics.fmean(cpu):.3f} ms)")
    print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


def run(label: str, target, rows: int, calls: int) -> None:
    now = time.time()
    started = time.perf_counter()
    build(target, rows, now)
    print(f"{label}: {rows:,} ledger rows with their spends written in {time.perf_counter() - started:.1f} s; "
          f"{len(rules()):,} rules; {calls:,} checks")
    asyncio.run(measure(target, calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=5_000)
    _pg.add_arguments(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run("SQLite", Path(tmp) / "state.db", args.rows, args.calls)
    with _pg.server(args) as url:
        if url is not None:
            import psycopg

            fresh = _pg.database_url(url, 9100).replace("switchboard_bench_9100", "switchboard_bench_budgets")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP DATABASE IF EXISTS switchboard_bench_budgets")
                conn.execute("CREATE DATABASE switchboard_bench_budgets")
            run("PostgreSQL", fresh, args.rows, args.calls)


if __name__ == "__main__":
    main()
