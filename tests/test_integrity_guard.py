"""The integrity guard: a store whose pages are damaged is found at start, refuses new writes, tells
the user in one line, says ``corrupt`` on /healthz, names ``switchboard restore`` in an ERROR, and
still serves reads.  The damage is done to a copy of a real store: bytes flipped in the header of a
page of the messages table (the file's own header and schema stay sound, so it still opens)."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import aiohttp
import pytest

import state
from gateway.router import STORE_DAMAGED_LINE
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.waiting import eventually

KEPT = "the tulips by the gate are red this year"


def real_store(path: Path) -> str:
    """A store written by the real code: one short session first, then enough to fill many pages."""
    with state.SessionDB(path) as db:
        keep = db.sessions.create(state.new_session_id(), "telegram", model="fake-model", user_id="501")
        db.messages.append(keep, "user", KEPT)
        db.messages.append(keep, "assistant", "noted")
        for i in range(30):
            sid = db.sessions.create(state.new_session_id(), "telegram", model="fake-model")
            for j in range(10):
                db.messages.append(sid, "user", f"filler {i}.{j} " + "lorem ipsum " * 50)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return keep


def flip_a_messages_page(path: Path) -> int:
    """XOR bytes 3..11 (cell count, content offset, first cell pointers) of a leaf page in the middle of
    the messages table; returns its number."""
    conn = sqlite3.connect(path)
    pages = [r[0] for r in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno")]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    assert len(pages) > 10, pages
    victim = pages[len(pages) // 2]
    with open(path, "r+b") as f:
        f.seek((victim - 1) * page_size + 3)
        sound = f.read(9)
        f.seek((victim - 1) * page_size + 3)
        f.write(bytes(b ^ 0xFF for b in sound))
    return victim


def test_the_checker_finds_the_flipped_page_whole_or_table_by_table(tmp_path):
    path = tmp_path / "state.db"
    real_store(path)
    checker = state.IntegrityChecker(path)
    assert checker.targets() == [None]  # small: one step
    assert checker.check(None) == []
    checker.close()
    flip_a_messages_page(path)
    checker = state.IntegrityChecker(path)  # a fresh connection: the old one's page cache holds the sound page
    try:
        assert checker.check(None) != []
        by_table = {t: checker.check(t) for t in checker.targets(whole_file_bytes=0)}
        assert "sessions" in by_table and "messages" in by_table
        assert [t for t, problems in by_table.items() if problems] == ["messages"]
    finally:
        checker.close()


def test_a_refused_store_still_reads_and_every_write_says_what_to_do(tmp_path):
    path = tmp_path / "state.db"
    keep = real_store(path)
    with state.SessionDB(path) as db:
        db.refuse_writes(["messages: database disk image is malformed"])
        with pytest.raises(state.StoreCorrupt, match="switchboard restore"):
            db.messages.append(keep, "user", "one more")
        assert [m.content for m in db.messages.get(keep)] == [KEPT, "noted"]


async def test_the_daemon_started_on_a_damaged_store_refuses_writes_and_says_so(tmp_path):
    source = tmp_path / "made.db"
    keep = real_store(source)
    async with FakeTelegram() as tg, FakeModel() as model:
        side = TelegramSide(tg)
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-integrity-not-a-secret"},
            "auth": {"allow_all": True}, "logging": {"level": "INFO", "format": "text"},
            "ui": {"enabled": True}, **side.settings()})
        daemon.home.mkdir(mode=0o700)
        shutil.copyfile(source, daemon.db_path)
        flip_a_messages_page(daemon.db_path)
        start = await daemon.start()
        try:
            await side.ready(start, 20)
            port = int(re.search(r"local API on http://127\.0\.0\.1:(\d+)", daemon.log_path(0).read_text()).group(1))
            async with aiohttp.ClientSession() as http:
                async def health() -> dict:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                        return await response.json()

                found = await eventually(lambda: _corrupt(health()), 20, "/healthz saying corrupt")
                assert found["integrity"]["problems"], found["integrity"]
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    assert "switchboard_store_corrupt 1.0" in await response.text()
                # a user writes: told in one line, nothing stored
                tg.dm(tg.user(777, "Cleo"), "are you there?")
                sent = await tg.wait_for_sent(1, timeout=20)
                assert [m.visible_text for m in sent] == [STORE_DAMAGED_LINE]
                assert model.requests == []  # no turn ran on a store that cannot keep its answer
                # reads keep working: the dashboard shows a sound session's transcript
                async with http.get(f"http://127.0.0.1:{port}/ui/sessions/{keep}") as response:
                    page = await response.text()
                    assert response.status == 200, page[:500]
                assert KEPT in page
        finally:
            await daemon.stop()
    log = daemon.log_path(0).read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert any("integrity check" in line and "switchboard restore" in line for line in errors), log[-3000:]
    conn = sqlite3.connect(daemon.db_path)  # nothing was written: no session, route or message for Cleo
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 31
        assert conn.execute("SELECT count(*) FROM routes").fetchone()[0] == 0
        assert conn.execute("SELECT max(id) FROM messages").fetchone()[0] == 302
    finally:
        conn.close()


async def _corrupt(health) -> dict | None:
    body = await health
    return body if body["status"] == "corrupt" else None
