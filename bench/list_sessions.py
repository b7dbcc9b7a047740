"""Listing: the 20 most recent sessions with previews among 50,000, the seed's query beside ours.

    .venv/bin/python bench/list_sessions.py                 # 50,000 sessions, 3 messages each
    .venv/bin/python bench/list_sessions.py --sessions 5000

Both databases hold the same corpus sessions (``bench._corpus``: about 10 %
Chinese) and are built in a temporary directory, removed afterwards.

* ``seed``: the original design's "recent sessions with preview" query: correlated
  subqueries per session for the first user message and the last message
  time, over the seed's tables, ordered like ours by last activity
  (``ORDER BY last_active DESC LIMIT 20``; the seed ordered by start).
* ``ours``: ``SessionDB.sessions.list_rich()`` (preview and last activity
  are kept on the session row as messages are appended; ordered by last
  activity, with no index on it in schema v16: one pass over the session rows;
  compression chains collapse to their tip).

Prints p50/p95/max per listing over ``--repeat`` runs, plus a filtered
listing (``--source telegram``) and page 10 (offset 200).
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
from bench._stores import SEED_SCHEMA
from state import SessionDB

SEED_QUERY = """
SELECT s.*,
    COALESCE((SELECT SUBSTR(m.content, 1, 63) FROM messages m
              WHERE m.session_id = s.id AND m.role = 'user' AND m.content IS NOT NULL
              ORDER BY m.timestamp, m.id LIMIT 1), '') AS preview,
    COALESCE((SELECT MAX(m2.timestamp) FROM messages m2 WHERE m2.session_id = s.id), s.started_at) AS last_active
FROM sessions s {where}
ORDER BY last_active DESC, s.id DESC
LIMIT ? OFFSET ?
"""


def corpus_records(sessions: int, per_session: int) -> list[dict]:
    """``sessions`` sessions of ``per_session`` consecutive corpus messages each, as export records."""
    corpus = Corpus(seed=7)
    sources: dict[str, tuple[str, str]] = {}
    records: list[dict] = []
    for i, (session_id, role, content, tool_calls, tool_name, timestamp) in enumerate(
        corpus.messages(sessions * per_session)
    ):
        if session_id not in sources:
            meta = corpus.sessions[-1]
            sources[session_id] = (meta.source, meta.model)
        if i % per_session == 0:
            source, model = sources[session_id]
            records.append({"id": f"bench_{len(records):06d}", "source": source, "model": model,
                            "started_at": timestamp - 1, "messages": []})
        records[-1]["messages"].append({"role": role, "content": content, "tool_calls": tool_calls,
                                        "tool_name": tool_name, "timestamp": timestamp})
    for record in records:
        record["message_count"] = len(record["messages"])
    return records


def build_seed(path: Path, records: list[dict]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN")
    for stmt in SEED_SCHEMA:
        conn.execute(stmt)
    conn.executemany("INSERT INTO sessions (id, source, model, started_at, message_count) VALUES (?, ?, ?, ?, ?)",
                     [(r["id"], r["source"], r["model"], r["started_at"], r["message_count"]) for r in records])
    conn.executemany(
        "INSERT INTO messages (session_id, role, content, tool_calls, tool_name, timestamp) VALUES (?, ?, ?, ?, ?, ?)",
        [(r["id"], m["role"], m["content"], m["tool_calls"], m["tool_name"], m["timestamp"])
         for r in records for m in r["messages"]])
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return conn


def timed(fn, repeat: int) -> tuple[list[float], object]:
    result = fn()  # warm the page cache once, as a CLI run after the daemon has been writing would be
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=50_000)
    parser.add_argument("--messages-per-session", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(f"SQLite {sqlite3.sqlite_version}: {args.sessions:,} sessions x {args.messages_per_session} messages; "
          f"{args.repeat} listings each")
    t0 = time.perf_counter()
    records = corpus_records(args.sessions, args.messages_per_session)
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as tmp:
        seed = build_seed(Path(tmp) / "seed.db", records)
        ours = SessionDB(Path(tmp) / "ours.db")
        ours.transfer.import_sessions(enumerate(records, 1))
        ours.checkpoint("TRUNCATE")
        print(f"built both databases in {time.perf_counter() - t0:.0f} s")
        cases = [
            ("20 most recent", {}, "", ()),
            ("20 most recent, source=telegram", {"source": "telegram"}, "WHERE s.source = ?", ("telegram",)),
            ("page 10 (offset 200)", {"offset": 200}, "", ()),
        ]
        print(f"{'listing':<34} {'design':<6} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        for label, kwargs, where, params in cases:
            offset = kwargs.get("offset", 0)
            sql = SEED_QUERY.format(where=where)
            runs = {
                "seed": lambda: seed.execute(sql, (*params, 20, offset)).fetchall(),  # noqa: B023 - called within this iteration
                "ours": lambda: ours.sessions.list_rich(limit=20, **kwargs),  # noqa: B023 - called within this iteration
            }
            previews = {}
            for design, fn in runs.items():
                times, rows = timed(fn, args.repeat)
                previews[design] = [dict(r)["id"] for r in rows]
                print(f"{label:<34} {design:<6} {statistics.median(times):>8.3f} "
                      f"{times[int(len(times) * 0.95) - 1]:>8.3f} {times[-1]:>8.3f}", flush=True)
            same = "same sessions" if previews["seed"] == previews["ours"] else "DIFFERENT sessions"
            print(f"{'':<34} both list the {same}")
        ours.close()
        seed.close()


if __name__ == "__main__":
    main()
