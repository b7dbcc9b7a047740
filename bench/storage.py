"""``switchboard storage`` and the integrity guard: how long ``db.storage.report`` and ``PRAGMA
quick_check`` take on a SQLite store of N messages.

    .venv/bin/python bench/storage.py                      # 200,000 messages in 2,000 sessions
    .venv/bin/python bench/storage.py --messages 1000000

The store is created by ``SessionDB`` (the real schema, its search-index triggers) in a temporary
directory, filled with ``bench._corpus`` English texts (3 to 50 words) by bulk inserts over 12 months, checkpointed, then
reported ``--repeat`` times.  Prints the file's size and each run's seconds (``dbstat`` reads every page).
Then the integrity guard's check (``state.IntegrityChecker``): the whole file in one ``quick_check``,
and table by table as the daemon does it past 64 MiB (the total, and the longest single step).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import Corpus
from state import IntegrityChecker, SessionDB

YEAR = 365 * 86_400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--per-session", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    corpus = Corpus(seed=7)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        SessionDB(path).close()
        start = time.time() - YEAR
        sessions = max(1, args.messages // args.per_session)
        conn = sqlite3.connect(path)
        built = time.perf_counter()
        with conn:
            conn.executemany("INSERT INTO sessions (id, source, started_at) VALUES (?, ?, ?)",
                             [(f"s{i}", ("telegram", "discord", "slack", "cli")[i % 4], start + i * YEAR / sessions)
                              for i in range(sessions)])
            conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                             ((f"s{i // args.per_session}", "user", corpus._english(3, 50),
                               start + (i // args.per_session) * YEAR / sessions) for i in range(args.messages)))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        print(f"built {args.messages:,} messages in {sessions:,} sessions in {time.perf_counter() - built:.1f} s; "
              f"file {path.stat().st_size / 2**20:.1f} MiB")
        times = []
        with SessionDB(path) as db:
            for _ in range(args.repeat):
                t = time.perf_counter()
                report = db.storage.report()
                times.append(time.perf_counter() - t)
        print(f"storage_report: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} runs; "
              f"{len(report.objects)} tables and indexes, text {report.text_bytes / 2**20:.1f} MiB, "
              f"{len(report.by_month)} months, largest session {report.largest_sessions[0].bytes:,} bytes")
        checker = IntegrityChecker(path)
        try:
            t = time.perf_counter()
            problems = checker.check(None)
            whole = time.perf_counter() - t
            steps = []
            for table in checker.targets(whole_file_bytes=0):
                t = time.perf_counter()
                problems += checker.check(table)
                steps.append((time.perf_counter() - t, table))
        finally:
            checker.close()
        longest = max(steps)
        print(f"quick_check: whole file {whole:.2f} s; table by table {sum(s for s, _ in steps):.2f} s in "
              f"{len(steps)} steps, the longest {longest[0]:.2f} s ({longest[1]}); "
              f"{'ok' if not problems else problems[:3]}")


if __name__ == "__main__":
    main()
