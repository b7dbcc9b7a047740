"""AsyncSessionDB: the same methods as coroutines, and the event loop never waits on SQLite."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3

import psycopg
import pytest

from state import AsyncSessionDB, SessionDB, SessionNotFound, StateError, _gen_aio_face
from state._repo import KINDS, marked_methods
from state.db import public_methods
from tests.harness import eventually


def test_every_public_method_has_a_coroutine():
    names = set(public_methods("read")) | set(public_methods("write")) | set(public_methods("upkeep")) | {
        "checkpoint", "close"}
    missing = [n for n in names if not inspect.iscoroutinefunction(getattr(AsyncSessionDB, n, None))]
    assert missing == []
    # sanitize_title and refuse_writes touch no database: plain methods on both faces
    public = {n for n, m in vars(SessionDB).items() if callable(m) and not n.startswith("_")} - {
        "sanitize_title", "refuse_writes"}
    assert public <= names


def _every_marked_name() -> set[str]:
    names = {f"SessionDB.{n}" for kind in KINDS for n in public_methods(kind)}
    for attribute, repository in SessionDB.REPOSITORIES.items():
        names |= {f"{attribute}.{n}" for kind in KINDS for n in marked_methods(repository, kind)}
    return names


def test_every_repository_method_has_a_coroutine(tmp_path):
    db = SessionDB(tmp_path / "state.db")
    adb = AsyncSessionDB(db)
    try:
        for attribute, repository in SessionDB.REPOSITORIES.items():
            assert isinstance(getattr(db, attribute), repository)
            public = {n for n, m in vars(repository).items() if callable(m) and not n.startswith("_")}
            marked = {n for kind in KINDS for n in marked_methods(repository, kind)}
            assert public == marked, f"{repository.__name__}: every public method is marked reads/writes/upkeep"
            for name in marked:
                assert inspect.iscoroutinefunction(getattr(getattr(adb, attribute), name)), (attribute, name)
    finally:
        asyncio.run(adb.close())


def test_the_type_checkers_view_of_the_coroutines_is_current():
    """mypy reads AsyncSessionDB's coroutines from a stub generated from SessionDB's signatures."""
    committed = _gen_aio_face.STUB.read_text(encoding="utf-8")
    assert committed == _gen_aio_face.render(), (
        f"state/_aio_face.pyi no longer matches state/db.py: run `{_gen_aio_face.COMMAND}` and commit the result")
    declared: set[str] = set()
    owner = ""
    attributes = {f"Async{r.__name__}": a for a, r in SessionDB.REPOSITORIES.items()}
    for line in committed.splitlines():
        if line.startswith("class "):
            name = line.split()[1].split(":")[0].split("(")[0]
            owner = "SessionDB" if name == "AsyncFace" else attributes[name]
        elif "async def " in line:
            declared.add(f"{owner}.{line.split('async def ')[1].split('(')[0]}")
    assert declared == _every_marked_name()


async def test_a_repository_runs_on_the_stores_threads(store_target):
    adb = await AsyncSessionDB.open(store_target)
    try:
        assert await adb.prefs.get("telegram:dm:u1", "stream") is None
        await adb.prefs.set("telegram:dm:u1", "stream", "off", now=1.0)
        assert await adb.prefs.get("telegram:dm:u1", "stream") == "off"
        assert adb.db.prefs.get("telegram:dm:u1", "stream") == "off"
    finally:
        await adb.close()
    with pytest.raises(StateError, match="closed"):
        await adb.prefs.get("telegram:dm:u1", "stream")


async def test_round_trip_and_concurrent_appends(store_target):
    adb = await AsyncSessionDB.open(store_target)
    try:
        await adb.sessions.create("s", "telegram", title="async")
        ids = await asyncio.gather(*(adb.messages.append("s", "user", f"m{i}") for i in range(40)))
        assert len(set(ids)) == 40
        assert (await adb.sessions.get("s")).message_count == 40
        first = await adb.messages.append_inbound("s", "event", platform_message_id="e1")
        assert (await adb.messages.append_inbound("s", "event", platform_message_id="e1")) == (first.id, False)
        assert await adb.sessions.resolve_id("async") == "s"
        assert [r["id"] for r in await adb.sessions.list_rich()] == ["s"]
        assert len(await adb.search.messages("m7")) == 1
        with pytest.raises(SessionNotFound):
            await adb.messages.append("ghost", "user", "x")
    finally:
        await adb.close()
    with pytest.raises(StateError, match="closed"):
        await adb.sessions.get("s")


async def test_a_locked_database_does_not_block_the_loop(store_target, backend):
    adb = await AsyncSessionDB.open(store_target)
    await adb.sessions.create("s", "cli")
    if backend == "sqlite":  # another process holds the write lock
        holder = sqlite3.connect(store_target, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:  # another instance holds the session's row
        holder = psycopg.connect(store_target)
        holder.execute("SELECT * FROM sessions WHERE id = 's' FOR UPDATE")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    ticking = asyncio.create_task(ticker())
    try:
        write = asyncio.create_task(adb.messages.append("s", "user", "waits for the lock"))
        # the loop keeps running while the write waits on its thread
        await eventually(lambda: ticks >= 50, 5.0, "the event loop to tick 50 times while the write waits")
        assert not write.done()
        holder.rollback()  # both connections' way of letting go
        assert isinstance(await asyncio.wait_for(write, 10), int)
        assert [m.content for m in await adb.messages.get("s")] == ["waits for the lock"]
    finally:
        ticking.cancel()
        holder.close()
        await adb.close()


async def test_close_finishes_queued_writes(store_target):
    adb = AsyncSessionDB(SessionDB(store_target))
    await adb.sessions.create("s", "cli")
    pending = [asyncio.ensure_future(adb.messages.append("s", "user", str(i))) for i in range(20)]
    await asyncio.sleep(0)
    await adb.close()
    assert len(await asyncio.gather(*pending)) == 20
    with SessionDB(store_target) as db:
        assert db.messages.count("s") == 20
