"""How long the local API takes to find a conversation by its fingerprint, at 100,000 stored ones.

A client that sends its whole history and no session header (the openai SDK, LangChain, Open WebUI
without forwarded headers) is recognised by a fingerprint of the caller, the model, the first user
message and the first reply (``gateway.runtime.api_sessions``).  The fingerprint is a key of the
store's routing table (its primary key), so finding it is one indexed read plus the session row.

The store is a real one (``state.SessionDB``'s schema) holding --conversations fingerprinted API
conversations (a session with a question and its answer, its conversation route and its
fingerprint route), seeded in bulk.  Timed, through the daemon's own async store and the real
``Conversations.identify``: --lookups requests continuing a random stored conversation (found) and
as many whose fingerprint is unknown (not found), each alone (no other load).

    .venv/bin/python bench/api_fingerprint.py [--conversations 100000] [--lookups 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import state
from gateway.runtime.api_request import ChatRequest, ClientMessage
from gateway.runtime.api_sessions import Caller, Conversations, token_hash

CALLER = Caller(token_hash("Bearer sk-bench"), None)


def request(i: int) -> ChatRequest:
    """The next request of conversation ``i``: its first question, the answer it got, a new question."""
    return ChatRequest(messages=(ClientMessage("user", f"question number {i}: what should I cook tonight?"),
                                 ClientMessage("assistant", f"answer {i}: a risotto, with what you have."),
                                 ClientMessage("user", "and for dessert?")), model="gpt-4o-mini")


def seed(path: Path, conversations: Conversations, n: int) -> None:
    """``n`` conversations as the API stores them, in bulk (one transaction) on the real schema."""
    state.SessionDB(path).close()  # creates and migrates the store
    conn = sqlite3.connect(path)
    now = time.time()
    with conn:
        for i in range(n):
            sid = f"20260101_000000_{i:08x}"
            key = conversations.new_key()
            req = request(i)
            conn.execute("INSERT INTO sessions (id, source, model, session_key, started_at, last_active) "
                         "VALUES (?, 'api', 'gpt-4o-mini', ?, ?, ?)", (sid, key, now, now))
            conn.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, ?, ?, ?)",
                             [(sid, m.role, m.stored, now + j) for j, m in enumerate(req.messages[:2])])
            fingerprint = conversations.fingerprint_key(CALLER, req, req.messages[1].stored)
            conn.executemany("INSERT INTO routes (session_key, session_id, updated_at) VALUES (?, ?, ?)",
                             [(key, sid, now), (fingerprint, sid, now)])
    conn.close()


def micro(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"p50 {statistics.median(ordered) * 1e6:7.0f} µs   p99 {p99 * 1e6:7.0f} µs   "
            f"mean {statistics.fmean(ordered) * 1e6:7.0f} µs")


async def timed(conversations: Conversations, indexes: list[int], expect_found: bool) -> list[float]:
    samples = []
    for i in indexes:
        started = time.perf_counter()
        found = await conversations.identify(CALLER, request(i), None, None)
        samples.append(time.perf_counter() - started)
        assert (found.key is not None) == expect_found, (i, found)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        conversations = Conversations(None, "main", "gpt-4o-mini", "persona")
        started = time.perf_counter()
        seed(path, conversations, args.conversations)
        print(f"seeded {args.conversations:,} API conversations ({path.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - started:.1f} s")
        db = await state.AsyncSessionDB.open(path)
        try:
            conversations.db = db
            rng = random.Random(25)
            hits = [rng.randrange(args.conversations) for _ in range(args.lookups)]
            misses = [args.conversations + i for i in range(args.lookups)]
            cold = await timed(conversations, hits, True)  # pages read from the file the first time
            found = await timed(conversations, hits, True)
            unknown = await timed(conversations, misses, False)
        finally:
            await db.close()
        with state.SessionDB(path) as sync_db:  # the query alone, without the async store's thread hand-off
            keys = [conversations.fingerprint_key(CALLER, request(i), request(i).messages[1].stored) for i in hits]
            query = []
            for key in keys:
                started = time.perf_counter()
                assert sync_db.routes.session(key) is not None
                query.append(time.perf_counter() - started)
    print(f"identify, found, first read of each ({args.lookups} lookups): {micro(cold)}")
    print(f"identify, found, pages cached       ({args.lookups} lookups): {micro(found)}")
    print(f"identify, not found                 ({args.lookups} lookups): {micro(unknown)}")
    print(f"the query alone (SessionDB, found)   ({args.lookups} lookups): {micro(query)}")
    print("(each: the fingerprint hashed, its route and session read in one indexed query, through AsyncSessionDB)")


if __name__ == "__main__":
    asyncio.run(main())
