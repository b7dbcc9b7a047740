"""``switchboard storage``: how long ``db.storage.report`` takes on a SQLite store of N messages.

    .venv/bin/python bench/storage.py                      # 200,000 messages in 2,000 sessions
    .venv/bin/python bench/storage.py --messages 1000000

The store is created by ``SessionDB`` (the real schema, its search-index triggers) in a temporary
directory, filled with ``bench._corpus`` English texts (3 to 50 words) by bulk inserts over 12 months, checkpointed, then
reported ``--repeat`` times.  Prints the file's size and each run's seconds (``dbstat`` reads every page).
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
from state import SessionDB

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


if __name__ == "__main__":
    main()
