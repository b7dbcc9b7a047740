"""Automatic upkeep: retention in short steps, freed space returned, a record of what was done."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time

import aiohttp
import pytest
from fakes.model_server import FakeModel
from harness import eventually, gateway_config, running_gateway

import state
from gateway.runtime.daemon import Gateway
from state import AsyncSessionDB, SessionDB
from state._lock import GaveWay
from state.search import fts5

DAY = 86_400.0
TEXT = "the deploy log says the container restarted " * 40  # about 2 KB: pages worth returning


def _session(db: SessionDB, sid: str, *, started: float, last: float, ended: float | None, messages: int = 3,
             parent: str | None = None) -> str:
    db.sessions.create(sid, "telegram", parent_session_id=parent)
    db._engine.write(lambda conn: conn.execute(  # the session started back then
        "UPDATE sessions SET started_at = $1, last_active = NULL WHERE id = $2", (started, sid)))
    for i in range(messages):
        ts = started + (last - started) * (i + 1) / messages
        db.messages.append(sid, "user" if i % 2 == 0 else "assistant", f"{sid} {i} {TEXT}", timestamp=ts)
    if ended is not None:
        db.sessions.end(sid, "reset")
        db._engine.write(lambda conn: conn.execute(  # the session ended back then
            "UPDATE sessions SET ended_at = $1 WHERE id = $2", (ended, sid)))
    return sid


def _build(path, now):
    with SessionDB(path) as db:
        expired = {
            _session(db, "old", started=now - 10 * DAY, last=now - 9 * DAY, ended=now - 9 * DAY),
            _session(db, "old-parent", started=now - 8 * DAY, last=now - 8 * DAY, ended=now - 8 * DAY),
            # bigger than one step's budget: its messages go over several steps
            _session(db, "old-big", started=now - 5 * DAY, last=now - 4 * DAY, ended=now - 4 * DAY, messages=400),
            _session(db, "just-expired", started=now - 3 * DAY, last=now - 1.1 * DAY, ended=now - 1.1 * DAY),
        }
        kept = {
            _session(db, "child", started=now - 2 * 3600, last=now - 3600, ended=None, parent="old-parent"),
            _session(db, "old-but-open", started=now - 30 * DAY, last=now - 30 * DAY, ended=None),
            _session(db, "old-start-recent-talk", started=now - 20 * DAY, last=now - 3600, ended=now - 3600),
            _session(db, "ended-today", started=now - 0.5 * DAY, last=now - 0.4 * DAY, ended=now - 0.4 * DAY),
        }
    return expired, kept


async def test_one_pass_prunes_exactly_the_expired_sessions_and_shrinks_the_file(tmp_path):
    now = time.time()
    path = tmp_path / "state.db"
    expired, kept = _build(path, now)
    async with await AsyncSessionDB.open(path) as db:
        before = await db.upkeep.store_size()
        report = await state.run_upkeep(db, retention_days=1, now=now)
        remaining = {s["id"] for s in await db.sessions.list_rich(limit=100)}
        child = await db.sessions.get("child")
        last = await db.upkeep.last()
        after = await db.upkeep.store_size()
        hits = await db.search.messages("restarted", limit=1000)
    assert remaining == kept
    assert child.parent_session_id is None  # kept, its link to the pruned parent cleared
    assert report.sessions_pruned == len(expired) == 4
    assert report.messages_pruned == 3 + 3 + 400 + 3
    assert report.steps > 10  # the big session was cut into several short transactions
    assert before.auto_vacuum == "incremental" and report.pages_vacuumed > 0
    assert after.db_bytes < before.db_bytes and report.db_bytes_after == after.db_bytes
    assert {h["session_id"] for h in hits} == kept
    assert last == report.as_dict() and last["sessions_pruned"] == 4
    # the step that held the write lock longest is named, with its size
    longest = max(report.holds, key=lambda h: h.ms)
    assert last["longest_hold"] == str(longest) and longest.ms == report.longest_hold_ms
    assert [h.kind for h in report.holds].count("prune") >= 10 and {h.kind for h in report.holds} >= {"prune", "vacuum"}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM messages WHERE session_id NOT IN (SELECT id FROM sessions)").fetchone()[0] == 0
        fts5.flush(conn)
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")


async def test_a_pass_prunes_the_expired_sessions_on_either_backend(store_target):
    now = time.time()
    expired, kept = _build(store_target, now)
    async with await AsyncSessionDB.open(store_target) as db:
        report = await state.run_upkeep(db, retention_days=1, now=now)
        remaining = {s["id"] for s in await db.sessions.list_rich(limit=100)}
        child = await db.sessions.get("child")
        last = await db.upkeep.last()
        hits = await db.search.messages("restarted", limit=1000)
        orphans = await db.messages.count() - sum([(await db.sessions.get(sid)).message_count for sid in kept])
    assert remaining == kept and child.parent_session_id is None
    assert (report.sessions_pruned, report.messages_pruned) == (4, 3 + 3 + 400 + 3)
    assert report.steps > 10  # the big session was cut into several short transactions
    assert {h["session_id"] for h in hits} == kept
    assert orphans == 0
    assert last == report.as_dict()


def _index_bytes(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        sizes = {t: conn.execute(f"SELECT sum(length(block)) FROM {t}_data").fetchone()[0]
                 for t in ("messages_fts", "messages_fts_trigram")}
    conn.close()
    return sizes


async def test_a_large_prune_merges_the_pruned_messages_out_of_the_search_index(tmp_path):
    now = time.time()
    path = tmp_path / "state.db"
    expired, kept = _build(path, now)
    with SessionDB(path) as db:  # CJK text too, for the trigram index
        _session(db, "old-cjk", started=now - 6 * DAY, last=now - 6 * DAY, ended=None, messages=0)
        _session(db, "new-cjk", started=now - 3600, last=now - 60, ended=None, messages=0)
        for i in range(60):
            db.messages.append("old-cjk", "user", f"记忆系统 断裂连接 {i} 容器重启了" * 5, timestamp=now - 6 * DAY)
        db.messages.append("new-cjk", "user", "记忆系统 断裂连接 容器重启了", timestamp=now - 60)
        db.sessions.end("old-cjk", "reset")
    with sqlite3.connect(path) as conn:  # ended back then; every message indexed
        conn.execute("UPDATE sessions SET ended_at = $1, last_active = $2 WHERE id = 'old-cjk'",
                     (now - 6 * DAY, now - 6 * DAY))
        fts5.flush(conn)
    conn.close()
    before = _index_bytes(path)
    async with await AsyncSessionDB.open(path) as db:
        report = await state.run_upkeep(db, retention_days=1, now=now)
        latin = await db.search.messages("restarted", limit=1000)
        cjk = await db.search.messages("记忆系统 OR 容器重启", limit=1000)
    after = _index_bytes(path)
    assert report.sessions_pruned == len(expired) + 1 and report.index_merged
    # a prune only adds deletion entries to an index; merged, the deleted messages' entries are gone
    assert after["messages_fts"] < before["messages_fts"] / 2
    assert after["messages_fts_trigram"] < before["messages_fts_trigram"] / 2
    assert {h["session_id"] for h in latin} == kept
    assert {h["session_id"] for h in cjk} == {"new-cjk"}
    with sqlite3.connect(path) as conn:
        for table in ("messages_fts", "messages_fts_trigram"):  # held off during the prune, on again
            assert conn.execute(f"SELECT v FROM {table}_config WHERE k = 'automerge'").fetchone()[0] == 4
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('merge', -64)")
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
    conn.close()


async def test_without_retention_nothing_is_deleted_and_the_pass_is_recorded(store_target):
    now = time.time()
    path = store_target
    _expired, kept = _build(path, now)
    async with await AsyncSessionDB.open(path) as db:
        report = await state.run_upkeep(db, retention_days=None, now=now)
        remaining = await db.sessions.count()
        last = await db.upkeep.last()
    assert remaining == 8 and report.sessions_pruned == 0
    assert last["finished_at"] >= now and last["retention_days"] is None


async def test_a_session_resumed_during_the_pass_is_left_alone(store_target):
    now = time.time()
    path = store_target
    with SessionDB(path) as db:
        _session(db, "old", started=now - 10 * DAY, last=now - 9 * DAY, ended=now - 9 * DAY)
        cutoff = now - DAY
        db.messages.append("old", "user", "I am back", timestamp=now)  # activity after the candidates were read
        step = db.upkeep.prune_step(["old"], cutoff, 100)[0]
        assert (step.deleted, step.dropped, step.messages) == ([], ["old"], 0)
        assert db.messages.count("old") == 4


async def test_an_old_database_without_incremental_vacuum_says_so(tmp_path):
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as conn:  # created before auto_vacuum was set: the default, NONE
        conn.execute("CREATE TABLE placeholder (x)")
        conn.execute("DROP TABLE placeholder")
    conn.close()
    now = time.time()
    with SessionDB(path) as db:
        _session(db, "old", started=now - 10 * DAY, last=now - 9 * DAY, ended=now - 9 * DAY, messages=50)
    async with await AsyncSessionDB.open(path) as db:
        report = await state.run_upkeep(db, retention_days=1, now=now)
        size = await db.upkeep.store_size()
    assert report.sessions_pruned == 1 and size.auto_vacuum == "none"
    assert report.vacuum_needed and size.free_pages > 0 and report.pages_vacuumed == 0


@pytest.mark.slow  # 6 s measured under load: `make test-fast` leaves it out
async def test_the_daemon_prunes_by_itself_and_healthz_shows_the_store(tmp_path):
    now = time.time()
    _expired, kept = _build(tmp_path / "state.db", now)
    async with FakeModel() as model:
        async with running_gateway(tmp_path, model, store={"retention_days": 1}) as gw:
            before = gw.health()["store"]
            await eventually(lambda: gw.health()["store"]["last_upkeep"], timeout=30, what="the first upkeep pass")
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/healthz") as r:
                    store = (await r.json())["store"]
            remaining = {s["id"] for s in await gw.db.sessions.list_rich(limit=100)}
    assert before["retention_days"] == 1 and before["last_upkeep"] is None
    assert remaining == kept
    last = store["last_upkeep"]
    assert (last["sessions_pruned"], last["retention_days"]) == (4, 1)
    assert store["next_upkeep_at"] == pytest.approx(last["finished_at"] + 86_400)
    assert store["db_bytes"] == last["db_bytes_after"] and store["wal_bytes"] >= 0


async def test_other_processes_run_no_upkeep(tmp_path):
    async with FakeModel() as model:
        async with running_gateway(tmp_path, model, store={"retention_days": 1}) as gw:
            assert gw.health()["store"]["retention_days"] == 1
        cfg = gateway_config(tmp_path, model.base_url, store={"retention_days": 1})
        chat = Gateway(cfg, adapters={}, serve_api=False)  # what `switchboard chat` and `cron run` build
        await chat.start()
        try:
            assert chat.upkeep is None and chat.health()["store"] is None
        finally:
            await chat.stop(grace_seconds=5)


def test_a_full_index_merge_finishes_while_new_messages_keep_coming(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.sessions.create("live", "telegram")
        db.upkeep.automerge(False)  # as during a pass: each flush of 32 messages stays its own segment
        for i in range(32 * 40):  # forty segments, each of many distinct words
            db.messages.append("live", "user", f"message {i} " + " ".join(f"w{i * 31 + j}" for j in range(40)))
        segments = db.upkeep.fts_segments("messages_fts")
        assert len(segments) >= 10
        steps, start, left = 0, True, len(segments)
        while left and steps < 200:
            step, _hold = db.upkeep.merge_step("messages_fts", 16, segments, start)
            start, left, steps = False, step.left, steps + 1
            for i in range(64):  # two more segments between steps
                db.messages.append("live", "assistant", f"reply {steps} {i} the container restarted")
        db.upkeep.automerge(True)
        now = db.upkeep.fts_segments("messages_fts")
        found = db.search.messages("restarted", limit=1000)
    # every segment there was at the start merged away, in a few steps (asking for a full merge
    # at each step starts it over on a new level each time: 900 segments after 300 steps)
    assert left == 0 and steps < 50
    assert len(now) < 10
    assert len(found) == 64 * steps
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    conn.close()


async def test_each_prune_step_takes_only_the_sessions_its_budget_can_empty(tmp_path):
    # a step deletes about a budget of text from the first sessions in line; the sessions it did not
    # reach keep their message counts, so the next step is not handed a crowd of sessions it cannot empty
    now = time.time()
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        for i in range(40):
            _session(db, f"old-{i:02}", started=now - 9 * DAY + i, last=now - 8 * DAY, ended=now - 8 * DAY, messages=20)
    async with await AsyncSessionDB.open(path) as db:
        report = await state.run_upkeep(db, retention_days=1, now=now)
        left = await db.sessions.count()
    steps = [re.match(r"(\d+) sessions asked, \d+ messages \([\d,]+ of ([\d,]+) bytes\)", h.detail)
             for h in report.holds if h.kind == "prune"]
    asked = [(int(m.group(1)), int(m.group(2).replace(",", ""))) for m in steps]
    assert report.sessions_pruned == 40 and left == 0
    # sessions go to a step while their messages, counted as 64 bytes each, fit its budget: sessions of 20
    # messages, and the first in line partly emptied already
    assert all(sessions <= budget // 64 // 20 + 1 for sessions, budget in asked), asked


async def test_a_wal_past_its_limit_is_emptied_only_when_the_daemon_is_idle(tmp_path):
    path = tmp_path / "state.db"
    async with await AsyncSessionDB.open(path) as db:
        await db.sessions.create("live", "telegram")
        for i in range(200):  # about 400 KB of WAL: past a 64 KiB limit
            await db.messages.append("live", "user", f"{i} {TEXT}")
        busy = await state.run_upkeep(db, retention_days=None, idle=lambda: False, wal_limit_bytes=65_536)
        wal_busy = (await db.upkeep.store_size()).wal_bytes
        quiet = await state.run_upkeep(db, retention_days=None, idle=lambda: True, wal_limit_bytes=65_536)
        wal_quiet = (await db.upkeep.store_size()).wal_bytes
        found = await db.search.messages("restarted", limit=1000)
    # a turn running: the WAL is left for later (a TRUNCATE checkpoint makes writers wait while it runs)
    assert not busy.wal_truncated and wal_busy > 65_536 and busy.wal_bytes_after == wal_busy
    # idle: emptied (then the pass's own record is its first page again)
    assert quiet.wal_truncated and quiet.wal_bytes_after == 0 and wal_quiet < 8_192
    assert len(found) == 200


def _long_statement(conn: sqlite3.Connection, started: threading.Event) -> None:
    """A statement that would run for minutes, which says when it has begun."""
    conn.create_function("begun", 1, lambda x: started.set() or 0)
    conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000000)"
                  " SELECT count(*) FROM c WHERE begun(x)").fetchone()


def test_a_step_gives_way_to_a_write_that_comes_while_it_runs(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.sessions.create("s", "telegram")
        engine = db._engine
        started, outcome = threading.Event(), {}

        def step(conn):
            conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'upkeep', 0)")
            _long_statement(conn, started)

        def upkeep():
            try:
                engine.write_giving_way(step)
                outcome["upkeep"] = "finished"
            except GaveWay:
                outcome["upkeep"] = "gave way"

        thread = threading.Thread(target=upkeep)
        thread.start()
        assert started.wait(10)
        db.messages.append("s", "user", "a live message")  # waits for the step to give way, not to finish
        thread.join(10)
        contents = [m.content for m in db.messages.get("s")]
        db.messages.append("s", "user", "and the next one")  # the store writes on as usual
        assert [m.content for m in db.messages.get("s")] == ["a live message", "and the next one"]
    assert outcome == {"upkeep": "gave way"}
    assert contents == ["a live message"]  # the step's own insert was rolled back


def test_a_write_never_gives_way_to_another(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.sessions.create("s", "telegram")
        started, outcome = threading.Event(), {}

        def long_write():
            def step(conn):
                conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'first', 0)")
                conn.create_function("begun", 1, lambda x: started.set() or 0)
                conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000)"
                             " SELECT count(*) FROM c WHERE begun(x)").fetchone()
            db._engine.write(step)
            outcome["first"] = "finished"

        thread = threading.Thread(target=long_write)
        thread.start()
        assert started.wait(10)
        db.messages.append("s", "user", "second")
        thread.join(10)
        contents = [m.content for m in db.messages.get("s")]
    assert outcome == {"first": "finished"} and contents == ["first", "second"]


async def test_upkeep_under_a_steady_stream_of_writes_loses_nothing(tmp_path):
    now = time.time()
    path = tmp_path / "state.db"
    expired, kept = _build(path, now)
    async with await AsyncSessionDB.open(path) as db:
        await db.sessions.create("live", "telegram")
        done = asyncio.Event()
        written: list[int] = []

        async def writer():
            i = 0
            while not done.is_set():
                await db.messages.append("live", "user", f"live {i} {TEXT}")
                written.append(i)
                i += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(writer())
        report = await state.run_upkeep(db, retention_days=1, now=now)
        done.set()
        await task
        remaining = {s["id"] for s in await db.sessions.list_rich(limit=100)}
        live = await db.messages.get("live")
        hits = await db.search.messages("restarted", limit=10_000)
    assert report.gave_way > 0  # steps of about 2 ms, a write every millisecond or so: some came mid-step
    assert remaining == kept | {"live"} and report.sessions_pruned == len(expired)
    assert [m.content.split()[1] for m in live] == [str(i) for i in written]
    assert {h["session_id"] for h in hits} == kept | {"live"}
    assert len([h for h in hits if h["session_id"] == "live"]) == len(written)
    with sqlite3.connect(path) as conn:
        for table in ("messages_fts", "messages_fts_trigram"):
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
    conn.close()
