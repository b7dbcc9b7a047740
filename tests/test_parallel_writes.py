"""Writes side by side on PostgreSQL, one at a time on SQLite, and each session's in the order sent.

``AsyncSessionDB`` gives PostgreSQL several writer threads (``state.aio.PG_WRITERS``), each on a
connection of the pool: writes to different sessions commit side by side, while a session's own
writes, submitted one after another without waiting, still land in that order (they go to the
writer their session picks).  SQLite keeps its one writer.
"""

from __future__ import annotations

import asyncio
import threading

from state import AsyncSessionDB, SessionDB
from state.aio import PG_WRITERS


async def test_writes_of_many_sessions_sent_at_once_keep_each_sessions_order(store_target, backend):
    db = AsyncSessionDB(SessionDB(store_target))
    try:
        sessions = [f"s{i}" for i in range(8)]
        for sid in sessions:
            await db.sessions.create(sid, "api")
        # every write submitted before any is awaited: 8 sessions x 40 messages, interleaved
        writes = [db.messages.append(sid, "user", f"{sid} #{n}") for n in range(40) for sid in sessions]
        await asyncio.gather(*writes)
        for sid in sessions:
            assert [m.content for m in await db.messages.get(sid)] == [f"{sid} #{n}" for n in range(40)]
        writers = {t.name for t in threading.enumerate() if t.name.startswith("state-writer")}
        assert len(writers) == (1 if backend == "sqlite" else PG_WRITERS) and PG_WRITERS > 1
    finally:
        await db.close()


async def test_on_postgresql_a_slow_write_does_not_hold_up_another_sessions(pg_url):
    """A write that waits on a row lock (another client holds it) keeps only its own writer: the other
    sessions' writes go on meanwhile.  With one writer thread they would all wait behind it."""
    import psycopg

    db = AsyncSessionDB(SessionDB(pg_url))
    try:
        free = [f"free{i}" for i in range(8)]
        for sid in ("held", *free):
            await db.sessions.create(sid, "api")
        with psycopg.connect(pg_url) as other:
            other.execute("SELECT id FROM sessions WHERE id = 'held' FOR UPDATE")  # a lock the next write waits on
            stuck = asyncio.ensure_future(db.sessions.end("held", "test"))
            await asyncio.sleep(0.3)
            assert not stuck.done()
            others = [asyncio.ensure_future(db.messages.append(sid, "user", "meanwhile")) for sid in free]
            done, _ = await asyncio.wait(others, timeout=5.0)
            assert done and not stuck.done(), "no other session's write went through while one waited"
            other.rollback()
        await asyncio.wait_for(asyncio.gather(stuck, *others), 10.0)
    finally:
        await db.close()
