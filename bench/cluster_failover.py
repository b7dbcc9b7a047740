"""Seconds from SIGKILL of the instance owning a platform connection to a standby taking it over.

A throw-away PostgreSQL (tests/pgserver.py) and owner processes from
tests/clusterkit.py, each a real ``ConnectionOwner`` holding the advisory lock on
a dedicated connection and "polling" while it owns the key.  One instance owns
it and one stands by; the owner gets SIGKILL, a fresh standby is started, and so
on --kills times.  Two figures per kill, p50 and max:

* lock: until the standby holds the advisory lock (seen in ``pg_locks``, polled every 10 ms);
* owner: until it reports ownership and may start the platform connection, which
  adds ``trust_seconds`` on purpose (a paused old owner must have stopped by then).

Target: owner <= ``cluster.failover_seconds`` (--failover, default 10).

    .venv/bin/python bench/cluster_failover.py [--kills 10] [--failover 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg

from state.cluster import OwnerTiming
from tests.clusterkit import child_command, child_env, read_events
from tests.pgserver import PgCluster, why_unavailable
from tests.waiting import eventually

KEY = "telegram:bench"


def owned_at(events: Path) -> float | None:
    return next((when for when, what, _ in read_events(events) if what == "owned"), None)


async def lock_holder(conn: psycopg.AsyncConnection) -> str | None:
    cur = await conn.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE 'switchboard owner %'")
    row = await cur.fetchone()
    return row[0].removeprefix("switchboard owner ") if row else None


async def standing_by(conn: psycopg.AsyncConnection, name: str) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                             (f"switchboard owner {name}",))
    return (await cur.fetchone())[0] == 1


async def run(url: str, kills: int, failover: float, tmp: Path, seed: int) -> tuple[list[float], list[float]]:
    procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(name: str) -> None:
        procs[name] = await asyncio.create_subprocess_exec(
            *child_command("owner", "--key", KEY, "--name", name, "--events", str(tmp / f"{name}.log"),
                           "--failover", str(failover), "--poll-every", "0.1"),
            env=child_env(url))

    timing = OwnerTiming.for_failover(failover)
    rng = random.Random(seed)
    lock_seconds: list[float] = []
    owner_seconds: list[float] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        try:
            await start("i0")
            await eventually(lambda: owned_at(tmp / "i0.log"), timeout=60, what="the first owner")
            for n in range(1, kills + 1):
                owner, standby = f"i{n - 1}", f"i{n}"
                await start(standby)
                await eventually(lambda s=standby: standing_by(conn, s), timeout=60, what="the standby to connect")
                await asyncio.sleep(rng.uniform(0, 2 * timing.poll_seconds))  # a kill at any point of its polling
                killed = time.time()
                procs[owner].kill()
                await procs[owner].wait()
                while await lock_holder(conn) != standby:
                    await asyncio.sleep(0.01)
                lock_seconds.append(time.time() - killed)
                took = await eventually(lambda s=standby: owned_at(tmp / f"{s}.log"), timeout=60, what="the new owner")
                owner_seconds.append(took - killed)
                print(f"  kill {n}: lock {lock_seconds[-1]:.2f} s, owner {owner_seconds[-1]:.2f} s", flush=True)
        finally:
            for proc in procs.values():
                if proc.returncode is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    await proc.wait()
    return lock_seconds, owner_seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--failover", type=float, default=10.0, help="cluster.failover_seconds")
    parser.add_argument("--seed", type=int, default=1, help="when, in the standby's polling, each kill comes")
    args = parser.parse_args()
    reason = why_unavailable()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    timing = OwnerTiming.for_failover(args.failover)
    print(f"SIGKILL of the owner -> a standby takes over; failover_seconds {args.failover:g} (standbys poll every "
          f"{timing.poll_seconds:g} s, a new owner waits {timing.trust_seconds:g} s), {args.kills} kills")
    cluster = PgCluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lock, owner = await run(cluster.fresh_database(), args.kills, args.failover, Path(tmp), args.seed)
    finally:
        cluster.stop()
    for name, seconds in (("standby holds the lock", lock), ("standby owns the connection", owner)):
        print(f"  {name}: p50 {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s")
    verdict = "within" if max(owner) <= args.failover else "OVER"
    print(f"  worst takeover {max(owner):.2f} s: {verdict} failover_seconds ({args.failover:g} s)")


if __name__ == "__main__":
    asyncio.run(main())
