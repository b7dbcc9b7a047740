"""One upkeep pass over a big store, and what a writer notices meanwhile.

    .venv/bin/python bench/upkeep.py                    # 1,000,000 messages
    .venv/bin/python bench/upkeep.py --messages 200000  # a quicker run

The database is ``bench/_stores.py``'s "ours" store of ``bench._corpus``
messages (bulk inserts with the real schema, so the search indexes are
filled by the real triggers; ``auto_vacuum=INCREMENTAL`` as the store creates
it), built once into ``bench/.data/ours-<n>.db`` and shared with the other
benchmarks.  Each run copies it, ends every session at its last message,
sets the clock so that the older half of the sessions (by last activity) is
past ``retention_days: 1``, and prints:

* the time for one pass of :func:`state.run_upkeep` (prune, incremental
  vacuum, checkpoint) and how many write transactions it took;
* the longest any of them held the write lock (target <= 50 ms), and the
  ``--top`` longest holds by name and size (a prune step's sessions, messages
  and bytes; a merge step's index and pages; a vacuum step's pages), each
  with the part its COMMIT took (a checkpoint SQLite runs at commit shows there);
* the file size before and after (database + WAL);
* the latency of a concurrent writer (one message appended through the same
  async store every ``--interval`` ms), p50/p99/max, for ``--baseline``
  seconds without the pass and then during it (target: p99 <= 2x), and what
  each write slower than twice the quiet p99 overlapped (the step or
  checkpoint it waited behind, or nothing of the pass).

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import state
from bench import _stores

DATA = _stores.DATA
DAY = 86_400.0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def end_sessions(path: Path) -> None:
    """End every session at its last message (at its start when it has none), as upkeep expects."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute(
        "UPDATE sessions SET (last_active, ended_at, end_reason) = (SELECT ifnull(max(timestamp), sessions.started_at),"
        " ifnull(max(timestamp), sessions.started_at), 'reset' FROM messages m WHERE m.session_id = sessions.id)")
    conn.execute("COMMIT")
    conn.close()


async def _writer(db, sid: str, interval: float, stop: asyncio.Event, writes: list[tuple[float, float]]) -> None:
    """Append a message every ``interval`` seconds until ``stop``; ``writes`` gets (start, seconds) of each."""
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        await db.messages.append(sid, "user", f"live message {i} while the store keeps itself in check")
        writes.append((t, time.perf_counter() - t))
        i += 1
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t)))


def _slow_writes(writes: list[tuple[float, float]], report, over: float) -> str:
    """What each write slower than ``over`` seconds waited behind: the upkeep step or checkpoint
    that overlapped it the longest."""
    events = sorted([*report.holds, *report.checkpoints], key=lambda h: h.began)
    starts = [h.began for h in events]
    longest = max((h.ms / 1000 for h in events), default=0.0)
    slow = [(t, s) for t, s in writes if s > over]
    behind: dict[str, int] = {}
    for t, s in slow:
        best, overlap = "nothing of the pass", 0.0
        for h in events[bisect.bisect_left(starts, t - longest):bisect.bisect_right(starts, t + s)]:
            o = min(t + s, h.began + h.ms / 1000) - max(t, h.began)
            if o > overlap:
                best, overlap = h.kind, o
        behind[best] = behind.get(best, 0) + 1
    return (f"{len(slow):,} of {len(writes):,} writes over {over * 1000:.2f} ms, overlapping: "
            + (", ".join(f"{k} {n:,}" for k, n in sorted(behind.items(), key=lambda kv: -kv[1])) or "-"))


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _line(label: str, writes: list[tuple[float, float]]) -> str:
    ms = [s * 1000 for _t, s in writes]
    return (f"  {label:22} {len(ms):6,} writes  p50 {statistics.median(ms):6.2f} ms  p99 {_pct(ms, 0.99):7.2f} ms"
            f"  max {max(ms):7.2f} ms")


async def run(args) -> None:
    source = _stores.build("ours", args.messages)
    work = DATA / f"upkeep-{args.messages}.work.db"
    for p in (work, Path(f"{work}-wal"), Path(f"{work}-shm"), Path(f"{work}-lock")):
        p.unlink(missing_ok=True)
    shutil.copyfile(source, work)
    end_sessions(work)
    conn = sqlite3.connect(work)
    sessions, messages = conn.execute("SELECT count(*), sum(message_count) FROM sessions").fetchone()
    median = conn.execute("SELECT last_active FROM sessions ORDER BY last_active LIMIT 1 OFFSET ?",
                          (sessions // 2,)).fetchone()[0]
    conn.close()
    now = median + DAY  # with retention_days: 1, the older half is past retention
    size_before = _size(work)
    print(f"Upkeep over {messages:,} messages in {sessions:,} sessions, half past retention_days: 1; "
          f"database + WAL {_mib(size_before)}\n")
    async with await state.AsyncSessionDB.open(work) as db:
        await db.sessions.create("live", "telegram")
        quiet: list[tuple[float, float]] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(_writer(db, "live", args.interval / 1000, stop, quiet))
        await asyncio.sleep(args.baseline)
        stop.set()
        await writer
        busy: list[tuple[float, float]] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(_writer(db, "live", args.interval / 1000, stop, busy))
        t = time.perf_counter()
        report = await state.run_upkeep(db, retention_days=1, now=now)
        elapsed = time.perf_counter() - t
        stop.set()
        await writer
    size_after = _size(work)
    holds = sorted(report.holds_ms)
    print(f"one pass: {elapsed:,.1f} s, {report.steps:,} write transactions; pruned {report.sessions_pruned:,} "
          f"sessions, {report.messages_pruned:,} messages; "
          f"{report.pages_vacuumed:,} pages returned")
    print(f"write-lock hold per transaction: p50 {_pct(holds, 0.5):.1f} ms, p99 {_pct(holds, 0.99):.1f} ms, "
          f"longest {report.longest_hold_ms:.1f} ms (target <= 50 ms); the write lock held "
          f"{sum(holds) / 1000 / elapsed:.0%} of the pass")
    for kind in report.longest_hold_ms_by_step:
        ms = sorted(h.ms for h in report.holds if h.kind == kind)
        commits = sorted(h.commit_ms for h in report.holds if h.kind == kind)
        print(f"  {kind:9} {len(ms):6,} steps, {sum(ms) / 1000:6.1f} s under the lock: p50 {_pct(ms, 0.5):5.1f} ms,"
              f" p90 {_pct(ms, 0.9):5.1f} ms, p99 {_pct(ms, 0.99):5.1f} ms, longest {ms[-1]:6.1f} ms;"
              f" commit p99 {_pct(commits, 0.99):5.1f} ms")
    print("  the longest holds:")
    for hold in sorted(report.holds, key=lambda h: -h.ms)[:args.top]:
        print(f"    {hold}")
    if report.checkpoints:
        longest = max(report.checkpoints, key=lambda h: h.ms)
        print(f"  {len(report.checkpoints):,} checkpoints beside the writers (no write lock), longest {longest}")
    print(f"file size: {_mib(size_before)} before, {_mib(size_after)} after "
          f"(database {_mib(report.db_bytes_after)} + WAL {_mib(report.wal_bytes_after)} at the end of the pass)")
    print("concurrent writer (one append every "
          f"{args.interval:g} ms through the same async store):")
    print(_line("without the pass", quiet))
    print(_line("during the pass", busy))
    quiet_p99 = _pct([s for _t, s in quiet], 0.99)
    print(f"  p99 during / without: {_pct([s for _t, s in busy], 0.99) / quiet_p99:.2f}x (target <= 2x)")
    print("  " + _slow_writes(busy, report, 2 * quiet_p99))
    for p in (work, Path(f"{work}-wal"), Path(f"{work}-shm"), Path(f"{work}-lock")):
        p.unlink(missing_ok=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--interval", type=float, default=5.0, help="ms between the concurrent writer's appends")
    ap.add_argument("--baseline", type=float, default=10.0, help="seconds of writing without the pass")
    ap.add_argument("--top", type=int, default=5, help="how many of the longest write-lock holds to name")
    asyncio.run(run(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
