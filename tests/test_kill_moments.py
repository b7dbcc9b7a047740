"""SIGKILL the real daemon at the worst moments for its database: in the middle of a WAL checkpoint,
of an incremental vacuum step, of an online backup and of a retention prune.  After each kill
``PRAGMA integrity_check`` is ok, nothing that was stored is lost (a pruned session is gone whole or
kept whole), and the daemon starts again on the same home.

Each moment is made long enough to hit and then watched from outside, the way an operator would see
it: the database file being written (a checkpoint: nothing else writes it while the WAL is full),
the free-page count falling (vacuum), the partial copy in the backup folder (backup), the session
count falling (prune).  A thread polls for it and sends SIGKILL at once; the test then checks that
the moment really was cut short (the WAL still full, pages still free, the partial file left, old
sessions still there).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import state
from gateway.runtime.autobackup import list_backups
from tests.crashkit import Daemon, Start
from tests.waiting import eventually

DAY = 86_400.0
TEXT = "the quick brown fox jumps over the lazy dog and keeps running {n} " * 12  # about 800 bytes


def fill(path: Path, sessions: int, per_session: int, *, old: int = 0) -> None:
    """``sessions`` sessions of ``per_session`` messages through the real store; the first ``old`` of
    them ended ten days ago (what retention prunes)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    ids = []
    with state.SessionDB(path) as db:
        for i in range(sessions):
            sid = db.sessions.create(state.new_session_id(), "telegram", model="fake-model", user_id=str(i))
            db.messages.append_many(sid, [{"role": "user" if j % 2 == 0 else "assistant", "content": TEXT.format(n=f"{i}.{j}")}
                                     for j in range(per_session)])
            ids.append(sid)
            if i < old:
                db.sessions.end(sid, "idle")
    if old:
        conn = sqlite3.connect(path)
        past = time.time() - 10 * DAY
        with conn:
            conn.executemany("UPDATE sessions SET started_at = ?, ended_at = ?, last_active = ? WHERE id = ?",
                             [(past, past + 60, past + 30, sid) for sid in ids[:old]])
        conn.close()


def digest(path: Path, where: str = "1") -> tuple[int, str]:
    """How many messages, and a hash of every one (id, session, role, text), of the sessions ``where``
    (read-only: closing it never checkpoints the WAL, which the checkpoint test needs left full)."""
    conn = reader(path)
    try:
        rows = conn.execute(f"SELECT m.id, m.session_id, m.role, m.content FROM messages m JOIN sessions s "
                            f"ON s.id = m.session_id WHERE {where} ORDER BY m.id").fetchall()
    finally:
        conn.close()
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return "; ".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


def reader(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


async def start_and_kill_when(daemon: Daemon, moment: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Start the daemon and SIGKILL it the instant ``moment()`` is true (polled on a thread every half
    millisecond from the moment the process exists: start-up itself may be the moment)."""
    daemon.proc = None
    starting = asyncio.create_task(daemon.start())
    while daemon.proc is None:
        await asyncio.sleep(0.0005)
    pid = daemon.proc.pid

    def watch() -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if moment():
                os.kill(pid, signal.SIGKILL)
                return True
            time.sleep(0.0005)
        return False

    caught = await asyncio.to_thread(watch)
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    await daemon.kill()
    assert caught, f"no {what} seen in {timeout:.0f}s; the daemon's log:\n{daemon.log_tail()}"
    daemon.starts.append(Start(0.0, 0.0))  # the next run logs to a file of its own


async def starts_again(daemon: Daemon) -> None:
    await daemon.start()
    assert await daemon.stop() == 0, daemon.log_tail()
    assert integrity(daemon.db_path) == "ok"


def settings(**extra) -> dict:
    return {"model": {"base_url": "http://127.0.0.1:9/v1", "name": "fake-model"},
            "logging": {"level": "INFO", "format": "text"}, **extra}


async def test_a_kill_during_a_wal_checkpoint(tmp_path):
    daemon = Daemon(tmp_path, settings())
    fill(daemon.db_path, 60, 100)
    # Make every message 12 KB longer in a process that then dies without checkpointing: the daemon finds
    # a WAL of more than 64 MiB of distinct pages, which it copies back (upkeep empties a WAL past that).
    script = textwrap.dedent(f"""
        import os, signal, sqlite3
        conn = sqlite3.connect({str(daemon.db_path)!r}, isolation_level=None)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("UPDATE messages SET content = content || printf('%.*c', 12000, 'x')")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", script], timeout=120)
    wal = daemon.db_path.with_name("state.db-wal")
    assert wal.stat().st_size > state.WAL_LIMIT_BYTES, wal.stat().st_size
    before = digest(daemon.db_path)
    untouched = daemon.db_path.stat().st_mtime_ns
    await start_and_kill_when(daemon, lambda: daemon.db_path.stat().st_mtime_ns != untouched,
                              "write to the database file")
    assert wal.stat().st_size > state.WAL_LIMIT_BYTES  # cut short: the WAL was not emptied
    assert integrity(daemon.db_path) == "ok"
    assert digest(daemon.db_path) == before
    await starts_again(daemon)
    assert digest(daemon.db_path) == before


async def test_a_kill_during_an_incremental_vacuum_step(tmp_path):
    daemon = Daemon(tmp_path, settings())
    fill(daemon.db_path, 300, 40)
    with state.SessionDB(daemon.db_path) as db:
        doomed = [s["id"] for s in db.sessions.list_rich(limit=1000)][:240]
        for sid in doomed:
            db.sessions.delete(sid)
    before = digest(daemon.db_path)
    watch = reader(daemon.db_path)
    free = watch.execute("PRAGMA freelist_count").fetchone()[0]
    assert free > 2000, free
    try:
        await start_and_kill_when(daemon, lambda: 0 < watch.execute("PRAGMA freelist_count").fetchone()[0] < free - 100,
                        "vacuum step")
    finally:
        watch.close()
    left = reader(daemon.db_path)
    try:
        assert left.execute("PRAGMA freelist_count").fetchone()[0] > 0  # cut short
    finally:
        left.close()
    assert integrity(daemon.db_path) == "ok"
    assert digest(daemon.db_path) == before
    await starts_again(daemon)
    assert digest(daemon.db_path) == before


async def test_a_kill_during_an_online_backup(tmp_path):
    daemon = Daemon(tmp_path, settings(backup={"every": "2s", "keep": 3}))
    fill(daemon.db_path, 150, 100)
    before = digest(daemon.db_path)
    folder = daemon.home / "backups"
    await start_and_kill_when(daemon, lambda: folder.is_dir() and any(n.startswith(".state-") for n in os.listdir(folder)),
                    "partial backup file")
    assert list_backups(folder) == []  # cut short: no backup was finished
    assert integrity(daemon.db_path) == "ok"
    assert digest(daemon.db_path) == before
    await daemon.start()
    try:  # the restarted daemon clears the partial copy and makes a good backup
        await eventually(lambda: list_backups(folder), 60, "a backup after the restart")
        assert not [n for n in os.listdir(folder) if n.startswith(".state-")]
    finally:
        assert await daemon.stop() == 0
    assert integrity(list_backups(folder)[0]) == "ok"
    assert digest(list_backups(folder)[0]) == before
    assert digest(daemon.db_path) == before


async def test_a_kill_during_a_retention_prune(tmp_path):
    daemon = Daemon(tmp_path, settings(store={"retention_days": 1}))
    fill(daemon.db_path, 500, 20, old=400)
    kept_before = digest(daemon.db_path, "s.ended_at IS NULL")
    per_old = {}
    conn = sqlite3.connect(daemon.db_path)
    try:
        per_old = dict(conn.execute("SELECT session_id, count(*) FROM messages WHERE session_id IN "
                                    "(SELECT id FROM sessions WHERE ended_at IS NOT NULL) GROUP BY session_id"))
    finally:
        conn.close()
    watch = reader(daemon.db_path)
    try:
        await start_and_kill_when(daemon, lambda: 100 < watch.execute("SELECT count(*) FROM sessions").fetchone()[0] < 480,
                        "retention prune")
    finally:
        watch.close()
    conn = sqlite3.connect(daemon.db_path)
    try:
        left = dict(conn.execute("SELECT s.id, count(m.id) FROM sessions s LEFT JOIN messages m ON m.session_id = s.id "
                                 "WHERE s.ended_at IS NOT NULL GROUP BY s.id"))
    finally:
        conn.close()
    assert 0 < len(left) < 400  # cut short
    # a step deletes some messages of a session and the session once it is empty: what is left of
    # an old session is some of its messages, never more; the live sessions lost nothing
    assert all(n <= per_old[sid] for sid, n in left.items())
    assert integrity(daemon.db_path) == "ok"
    assert digest(daemon.db_path, "s.ended_at IS NULL") == kept_before
    # started again, the daemon finishes the prune it was killed in (its pass never recorded an end)
    await daemon.start()
    try:
        count = reader(daemon.db_path)
        try:
            await eventually(lambda: count.execute("SELECT count(*) FROM sessions").fetchone()[0] == 100, 60,
                             "the old sessions pruned after the restart")
        finally:
            count.close()
    finally:
        assert await daemon.stop() == 0, daemon.log_tail()
    assert integrity(daemon.db_path) == "ok"
    assert digest(daemon.db_path, "s.ended_at IS NULL") == kept_before
    assert digest(daemon.db_path, "s.ended_at IS NOT NULL") == (0, digest(daemon.db_path, "0")[1])
