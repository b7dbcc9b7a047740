"""``switchboard insights``' query over a large usage ledger, and ``/usage``'s for one user.

    .venv/bin/python bench/insights.py                  # 1,000,000 ledger rows over 60 days
    .venv/bin/python bench/insights.py --rows 100000

The rows (20,000 sessions, 2,000 users on 4 platforms, 3 models, 7 purposes) are
written in time order, as the daemon writes them, into a database in a temporary
directory, removed afterwards.  Prints the time of ``SessionDB.usage_report`` plus
:func:`gateway.insights.summarize` for ``--days`` (half the rows) per grouping, and
of one user's report (``/usage``), best and median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.insights import summarize, window
from state import SessionDB
from state._usage import COLUMNS

PURPOSES = ["turn", "tool_loop", "compression", "recall", "memory_flush", "fact_extraction", "cron"]


def build(path: Path, rows: int, now: float) -> None:
    SessionDB(path).close()  # the schema
    rng = random.Random(1)
    data = sorted(
        (now - rng.random() * 60 * 86_400, f"s{i % 20_000}", rng.choice(["telegram", "discord", "slack", "api"]),
         f"c{i % 3_000}", f"u{i % 2_000}", "main", rng.choice(PURPOSES), rng.choice(["gpt-4o", "gpt-4o-mini", "local"]),
         rng.randint(100, 20_000), rng.randint(10, 800), rng.randint(0, 5_000), 0, 0, 800.0, "ok", None, 1,
         2.0, 8.0, 0.5, 0.001)
        for i in range(rows))
    with sqlite3.connect(path) as conn:
        conn.executemany(f"INSERT INTO model_calls ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                         data)


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        started = time.perf_counter()
        build(path, args.rows, now)
        print(f"{args.rows:,} ledger rows written in {time.perf_counter() - started:.1f} s")
        since, dates = window(args.days, now)
        with SessionDB(path) as db:
            for by in ("model", "day", "purpose", "platform", "user", "chat"):
                best, median = timed(lambda by=by: summarize(db.usage_report(since, by), dates), args.repeat)
                print(f"insights --days {args.days} --by {by:<8}  best {best:7.0f} ms  median {median:7.0f} ms")
            best, median = timed(lambda: db.usage_report(since, "day", platform="telegram", user_id="u7"),
                                 args.repeat)
            print(f"/usage (one user, {args.days} days)       best {best:7.1f} ms  median {median:7.1f} ms")


if __name__ == "__main__":
    main()
