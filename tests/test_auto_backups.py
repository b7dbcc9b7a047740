"""Automatic backups (``backup.every``, ``backup.keep``, ``backup.dir``): each checked, the oldest rotated
out, a failure a WARNING that is counted, refused on PostgreSQL with the pg_dump line; and a restore
drill: the newest automatic backup of a running daemon, restored into a fresh home, opens every session."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
from pathlib import Path

import aiohttp
import pytest
import yaml
from click.testing import CliRunner

import state
from gateway.cli.doctor import check_backups
from gateway.cli.service import restore_cmd
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.runtime.autobackup import AutoBackups, BackupSchedule, list_backups
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.waiting import eventually


def write_config(tmp_path: Path, **cfg) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), **cfg}))
    return path


def test_the_backup_keys_and_their_defaults(tmp_path):
    cfg = load_config(write_config(tmp_path, backup={"every": "1d", "keep": 3}), env={})
    assert (cfg.backup.every, cfg.backup.keep, cfg.backup_dir) == (86400.0, 3, tmp_path / "home" / "backups")
    cfg = load_config(write_config(tmp_path, backup={"every": "6h", "dir": "nightly"}), env={})
    assert (cfg.backup.every, cfg.backup.keep, cfg.backup_dir) == (21600.0, 7, tmp_path / "nightly")
    assert load_config(write_config(tmp_path), env={}).backup.every is None  # off unless asked for
    with pytest.raises(ConfigError, match=r"backup\.every.*not a duration"):
        load_config(write_config(tmp_path, backup={"every": "sometimes"}), env={})
    with pytest.raises(ConfigError, match=r"backup\.keep"):
        load_config(write_config(tmp_path, backup={"every": "1d", "keep": 0}), env={})


def test_on_postgresql_backup_every_is_refused_with_the_pg_dump_line(tmp_path):
    config = write_config(tmp_path, store={"url": "postgresql://sb:hunter2-secret@db.local:5432/switchboard"},
                          backup={"every": "1d"})
    with pytest.raises(ConfigError) as refused:
        load_config(config, env={})
    message = str(refused.value)
    assert "backup.every" in message
    assert "pg_dump --format=custom" in message and "db.local:5432/switchboard" in message
    assert "hunter2-secret" not in message
    assert refused.value.exit_code == 78


def _filled_home(home: Path, sessions: int = 3) -> None:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with state.SessionDB(home / "state.db") as db:
        for i in range(sessions):
            sid = db.sessions.create(state.new_session_id(), "telegram", model="m")
            db.messages.append(sid, "user", f"hello {i}")


async def test_each_run_is_checked_and_the_oldest_beyond_keep_are_removed(tmp_path):
    home, folder = tmp_path / "home", tmp_path / "backups"
    _filled_home(home)
    now = [1_800_000_000.0]
    backups = AutoBackups(home, BackupSchedule(every=3600, keep=2, dir=folder), clock=lambda: now[0])
    made = []
    for _ in range(4):
        made.append(await backups.run_once())
        now[0] += 3600
    assert list_backups(folder) == made[-2:]  # the two newest stay
    assert [p.name for p in made] == [f"state-20270115T{h:02d}0000Z.db" for h in (8, 9, 10, 11)]
    newest = sqlite3.connect(made[-1])
    try:
        assert newest.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert newest.execute("SELECT count(*) FROM messages").fetchone()[0] == 3
    finally:
        newest.close()
    status = backups.status()
    assert status["last_good"]["file"] == str(made[-1])
    assert status["last_good"]["age_seconds"] == 3600.0
    assert status["failures"] == 0 and status["keep"] == 2 and status["every"] == "1h"


async def test_a_failed_backup_is_a_warning_counted_and_the_earlier_ones_stay(tmp_path, caplog):
    home, folder = tmp_path / "home", tmp_path / "backups"
    _filled_home(home)
    counted = []
    backups = AutoBackups(home, BackupSchedule(every=3600, keep=2, dir=folder), failed=lambda: counted.append(1))
    good = await backups.run_once()
    (home / "state.db").rename(home / "elsewhere.db")  # the next run finds nothing to copy
    with caplog.at_level(logging.WARNING, logger="gateway.runtime.autobackup"):
        assert await backups.run_once() is None
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "automatic backup" in caplog.records[0].getMessage() and "failed" in caplog.records[0].getMessage()
    assert counted == [1]
    status = backups.status()
    assert status["failures"] == 1 and "no database" in status["last_failure"]["error"]
    assert status["last_good"]["file"] == str(good) and list_backups(folder) == [good]


async def test_restore_drill_the_newest_automatic_backup_opens_every_session(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        side = TelegramSide(tg)
        (tmp_path / "run").mkdir()
        daemon = Daemon(tmp_path / "run", {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-backup-not-a-secret"},
            "auth": {"allow_all": True}, "logging": {"level": "INFO", "format": "text"},
            "backup": {"every": "2s", "keep": 2}, **side.settings()})
        start = await daemon.start()
        folder = daemon.home / "backups"
        try:
            await side.ready(start, 20)
            for i in range(4):
                tg.dm(tg.user(900 + i, f"U{i}"), f"remember the number {i}")
            await tg.wait_for_sent(4, timeout=30)
            answered_at = asyncio.get_running_loop().time()
            # a backup made after the last answer was stored, and the rotation keeping two
            await eventually(lambda: len(list_backups(folder)) == 2 and _holds_answers(list_backups(folder)[-1], 4),
                             30, "a backup holding the four answers")
            port = int(re.search(r"local API on http://127\.0\.0\.1:(\d+)", daemon.log_path(0).read_text()).group(1))
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    health = await response.json()
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    metrics = await response.text()
            assert health["backup"]["last_good"]["age_seconds"] < 30, health["backup"]
            assert health["backup"]["failures"] == 0 and health["backup"]["keep"] == 2
            assert "switchboard_backup_last_success_timestamp_seconds" in metrics
            assert "switchboard_backup_failures_total 0.0" in metrics
            assert asyncio.get_running_loop().time() - answered_at < 60
        finally:
            assert await daemon.stop() == 0
        newest = list_backups(folder)[-1]
    fresh = tmp_path / "fresh"
    result = await asyncio.to_thread(CliRunner().invoke, restore_cmd, [str(newest), "--home", str(fresh)])
    assert result.exit_code == 0, result.output
    with state.SessionDB(daemon.db_path) as live, state.SessionDB(fresh / "state.db") as restored:
        originals = {s["id"]: [(m.role, m.content) for m in live.messages.get(s["id"])]
                     for s in live.sessions.list_rich(limit=100)}
        opened = {s["id"]: [(m.role, m.content) for m in restored.messages.get(s["id"])]
                  for s in restored.sessions.list_rich(limit=100)}
    assert len(opened) == 4
    assert opened == originals
    assert sorted(msgs[0][1] for msgs in opened.values()) == [f"remember the number {i}" for i in range(4)]
    assert all(role == "assistant" for msgs in opened.values() for role, _ in msgs[1:])


def _holds_answers(path: Path, answers: int) -> bool:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM messages WHERE role = 'assistant'").fetchone()[0] >= answers
    except sqlite3.Error:
        return False
    finally:
        conn.close()


async def test_doctor_shows_the_newest_backup_and_its_age(tmp_path):
    home = tmp_path / "home"
    _filled_home(home)
    cfg = load_config(write_config(tmp_path, backup={"every": "1h", "keep": 2}), env={})
    assert check_backups(cfg).ok is None and "none in" in check_backups(cfg).detail
    made = await AutoBackups(home, BackupSchedule(3600, 2, cfg.backup_dir)).run_once()
    fresh = check_backups(cfg)
    assert fresh.ok is True and f"newest {made}" in fresh.detail and "just now" in fresh.detail
    stale = made.stat().st_mtime - 3 * 3600
    os.utime(made, (stale, stale))
    old = check_backups(cfg)
    assert old.ok is False and "3 h ago" in old.detail and "automatic backup" in (old.fix or "")
    off = check_backups(load_config(write_config(tmp_path), env={}))
    assert off.ok is None and "off" in off.detail
