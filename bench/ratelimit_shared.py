"""What sharing the rate budgets through PostgreSQL costs per send, and whether three processes keep one budget.

A throw-away PostgreSQL (tests/pgserver.py), or ``--url`` of a server of yours (the user needs
CREATE DATABASE), with a database migrated to the current schema.

* slot take: p50 / p95 of ``RateLimiter.acquire()`` when a slot is free, in-process (no store)
  and shared (``share_budgets(PgBuckets)``: one upsert of the bucket's row), and of the bare
  ``state.cluster.budgets.reserve`` statement; a Telegram send takes two slots (its chat's and
  its token's), so it pays the shared figure twice.
* aggregate rate: three processes (``tests.budgetkit slots``) take slots of ONE bucket as fast
  as they are given them for ``--seconds``; the rate they reach together against the limit,
  shared, and with each process's own bucket for comparison.

    .venv/bin/python bench/ratelimit_shared.py [--takes 2000] [--rate 20] [--seconds 5] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg

from gateway.ratelimit import RateLimiter, share_budgets
from state import SessionDB
from state.cluster import PgBuckets
from state.cluster.budgets import reserve
from tests.pgserver import PgCluster, why_unavailable

FREE = 1e9  # a rate no take ever waits for: what is measured is the take itself


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"p50 {statistics.median(ms):.3f} ms   p95 {ms[int(len(ms) * 0.95) - 1]:.3f} ms"


async def timed(take, n: int) -> list[float]:
    for _ in range(min(100, n)):  # warm up (connect, prepared statements)
        await take()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await take()
        samples.append(time.perf_counter() - t0)
    return samples


async def slot_latency(url: str, n: int) -> None:
    local = RateLimiter(FREE, 10**9)
    print(f"  in-process acquire()       {percentiles(await timed(local.acquire, n))}")
    buckets = PgBuckets(url)
    share_budgets(buckets)
    shared = RateLimiter(FREE, 10**9, shared_key="bench:latency")
    try:
        print(f"  shared acquire()           {percentiles(await timed(shared.acquire, n))}")
    finally:
        share_budgets(None)
        await buckets.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        samples = await timed(lambda: reserve(conn, "bench:bare", FREE, 10**9), n)
    print(f"  bare reserve() statement   {percentiles(samples)}")


async def aggregate(url: str, rate: float, seconds: float, *, local: bool) -> float:
    env = {**os.environ, "SWITCHBOARD_TEST_PG_URL": url, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tests.budgetkit", "slots", "--key", f"agg-{time.time()}", "--rate", str(rate),
            "--burst", "1", "--seconds", str(seconds), *(["--local"] if local else [])]
    procs = [await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                  env=env) for _ in range(3)]
    for proc in procs:
        assert (await proc.stdout.readline()).strip() == b"ready"  # type: ignore[union-attr]
    for proc in procs:
        proc.stdin.write(b"go\n")  # type: ignore[union-attr]
    outs = [(await proc.communicate())[0].decode().split() for proc in procs]
    return sum(int(out[1]) for out in outs) / seconds


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--takes", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=20.0, help="the one bucket's rate for the aggregate test")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--url", help="a PostgreSQL server of yours (postgresql://user:password@host/db)")
    args = ap.parse_args()
    cluster = None
    if args.url is None:
        why = why_unavailable()
        if why:
            raise SystemExit(why)
        cluster = PgCluster.start()
    try:
        url = cluster.fresh_database() if cluster is not None else args.url
        SessionDB(url).close()  # the current schema, rate_buckets included
        print(f"slot take ({args.takes} takes, a free slot each time):")
        await slot_latency(url, args.takes)
        print(f"aggregate rate of 3 processes on one bucket of {args.rate:g}/s (burst 1), {args.seconds:g} s:")
        shared = await aggregate(url, args.rate, args.seconds, local=False)
        print(f"  shared         {shared:6.1f}/s  ({shared / args.rate:.2f} x the limit)")
        alone = await aggregate(url, args.rate, args.seconds, local=True)
        print(f"  each its own   {alone:6.1f}/s  ({alone / args.rate:.2f} x the limit)")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
