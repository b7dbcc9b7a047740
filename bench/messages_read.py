"""Reading a whole session: ``db.messages.get`` on SQLite, for sessions of 200 and 2,000 messages.

    .venv/bin/python bench/messages_read.py                  # 200 and 2,000 messages, 60 reads each
    .venv/bin/python bench/messages_read.py --sizes 500 --repeat 200

The local API reads a conversation's every stored message on each request that
continues it (to line the client's history up with the stored one), so this
read's cost grows with the conversation.  The sessions hold ``bench._corpus``
messages (user questions, answers, tool calls with their JSON, tool results),
appended through ``db.messages.append_many`` into a store built in a temporary
directory, removed afterwards.  For each session four reads, taken in turn
round after round (so the machine's noise falls on all of them alike):

* ``get``: ``db.messages.get`` (frozen ``state.StoredMessage`` values, JSON
  columns decoded);
* ``dict rows``: the read ``db.messages.get`` made before it returned values,
  on a plain ``sqlite3`` connection: a ``sqlite3.Row`` per message made a dict,
  its JSON columns decoded where they hold something;
* ``raw dicts``: the same query into one dict per row, nothing decoded: the
  floor for a read that hands out one object per message;
* ``as_conversation``: ``db.messages.as_conversation`` (the chat messages a
  turn shows the model).

Prints per read the median and p95 of wall time, the median of the process's
CPU time (steadier on a shared machine), and the wall median per message.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._corpus import Corpus
from state import SessionDB

ORDER_KEY = "COALESCE(pos, id * 1048576)"  # the store's order of a session's messages (``state._messages``)
JSON_COLUMNS = ("tool_calls", "reasoning_details", "codex_reasoning_items")


def corpus_messages(n: int) -> list[dict]:
    """``n`` consecutive corpus messages as ``append_many`` takes them (a tool result names its call)."""
    messages: list[dict] = []
    call_id = None
    for _, role, content, tool_calls, tool_name, timestamp in Corpus(seed=7).messages(n):
        message: dict = {"role": role, "content": content, "timestamp": timestamp}
        if tool_calls:
            message["tool_calls"] = json.loads(tool_calls)
            call_id = message["tool_calls"][0]["id"]
        if tool_name:
            message["tool_name"] = tool_name
            message["tool_call_id"] = call_id
        messages.append(message)
    return messages


def raw_dicts(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    cursor = conn.execute(f"SELECT * FROM messages WHERE session_id = ? ORDER BY {ORDER_KEY}", (session_id,))
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def dict_rows(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    rows = conn.execute(f"SELECT * FROM messages WHERE session_id = ? ORDER BY {ORDER_KEY}", (session_id,))
    messages = []
    for row in rows:
        message = dict(row)
        for key in JSON_COLUMNS:
            if message[key]:
                try:
                    message[key] = json.loads(message[key])
                except (json.JSONDecodeError, TypeError):
                    pass
        messages.append(message)
    return messages


def measure(reads: dict[str, Callable[[], object]], repeat: int) -> dict[str, tuple[list[float], list[float]]]:
    """Each read ``repeat`` times, in turn; (wall ms sorted, CPU ms) per read."""
    for read in reads.values():
        read()  # warm the page cache and the connections
    walls: dict[str, list[float]] = {label: [] for label in reads}
    cpus: dict[str, list[float]] = {label: [] for label in reads}
    for _ in range(repeat):
        for label, read in reads.items():
            cpu, start = time.process_time(), time.perf_counter()
            read()
            walls[label].append((time.perf_counter() - start) * 1000)
            cpus[label].append((time.process_time() - cpu) * 1000)
    return {label: (sorted(walls[label]), cpus[label]) for label in reads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="200,2000", help="messages per session, comma-separated")
    parser.add_argument("--repeat", type=int, default=60)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}: sessions of "
          f"{', '.join(f'{size:,}' for size in sizes)} messages; {args.repeat} reads each")
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as tmp:
        db = SessionDB(Path(tmp) / "state.db")
        raw = sqlite3.connect(Path(tmp) / "state.db")
        rows = sqlite3.connect(Path(tmp) / "state.db")
        rows.row_factory = sqlite3.Row
        print(f"{'messages':>8} {'read':<16} {'p50 ms':>8} {'p95 ms':>8} {'cpu p50':>8} {'µs/msg':>7}")
        for size in sizes:
            session_id = f"bench_{size}"
            db.sessions.create(session_id, "api")
            messages = corpus_messages(size)
            for start in range(0, size, 500):
                db.messages.append_many(session_id, messages[start:start + 500])
            db.checkpoint("TRUNCATE")
            reads: dict[str, Callable[[], object]] = {
                "get": lambda: db.messages.get(session_id),  # noqa: B023 - called within this iteration
                "dict rows": lambda: dict_rows(rows, session_id),  # noqa: B023
                "raw dicts": lambda: raw_dicts(raw, session_id),  # noqa: B023
                "as_conversation": lambda: db.messages.as_conversation(session_id),  # noqa: B023
            }
            assert len(db.messages.get(session_id)) == size
            for label, (walls, cpus) in measure(reads, args.repeat).items():
                p50 = statistics.median(walls)
                p95 = walls[max(0, int(len(walls) * 0.95) - 1)]
                print(f"{size:>8,} {label:<16} {p50:>8.2f} {p95:>8.2f} {statistics.median(cpus):>8.2f} "
                      f"{p50 / size * 1000:>7.1f}", flush=True)
        raw.close()
        rows.close()
        db.close()


if __name__ == "__main__":
    main()
