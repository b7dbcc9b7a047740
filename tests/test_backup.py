"""`switchboard backup` while another process writes, and the checks `switchboard restore` makes."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli.service import backup_cmd, restore_cmd
from gateway.runtime import backup as backup_mod
from state import SessionDB, new_session_id

# Appends "msg <i>" through the real store, one transaction each, and prints i
# once append_message has returned (= committed), until killed.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from state import SessionDB, new_session_id
    db = SessionDB(Path(sys.argv[1]) / "state.db")
    sid = db.sessions.create(new_session_id(), "telegram")
    print("session", sid, flush=True)
    padding = "x" * 2000  # grow the file so the backup takes many steps
    i = 0
    while True:
        db.messages.append(sid, "user", f"msg {i} {padding}")
        print(i, flush=True)
        i += 1
    """
)

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gateway.runtime import lockfile
    handle = lockfile.acquire(Path(sys.argv[1]))
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def _read_int(proc) -> int:
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the writer stopped: {proc.stderr.read()}")
    return int(line)


def _messages(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT content FROM messages ORDER BY id")]
    finally:
        conn.close()


def _integrity(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()


@pytest.fixture
def filled(tmp_path):
    """A home whose state.db holds 20 messages "m0".."m19"."""
    home = tmp_path / "home"
    with SessionDB(home / "state.db") as db:
        sid = db.sessions.create(new_session_id(), "discord")
        for i in range(20):
            db.messages.append(sid, "user", f"m{i}")
    return home


def run(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)


def test_backup_while_another_process_writes_holds_every_committed_message(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent,
    )
    try:
        assert writer.stdout.readline().startswith("session "), writer.stderr.read()
        committed = -1
        while committed < 400:  # a few MiB of messages before the backup starts
            committed = _read_int(writer)
        target = tmp_path / "backup.db"
        # a small step size: many steps, with the writer committing between them
        steps: list[tuple[int, int]] = []
        summary = backup_mod.backup(home, target, pages_per_step=8, progress=lambda r, t: steps.append((r, t)))
        live_after = len(_messages(home / "state.db"))
    finally:
        writer.kill()
        writer.wait(timeout=10)
    assert live_after > summary.messages  # the writer went on committing past the snapshot
    # many steps, and never restarted by the writer's commits: the remaining count only falls
    assert len(steps) > 20
    assert all(later[0] < earlier[0] for earlier, later in zip(steps, steps[1:], strict=False))
    assert _integrity(target) == ["ok"]
    contents = [c.split(" ")[1] for c in _messages(target)]
    # every message committed before the backup began, in order, and no gaps after
    assert contents == [str(i) for i in range(len(contents))]
    assert len(contents) >= committed + 1
    assert summary.messages == len(contents)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not Path(f"{target}-wal").exists()  # one self-contained file
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left


def test_backup_command_output_and_refusals(filled, tmp_path):
    target = tmp_path / "b.db"
    result = run(backup_cmd, target, "--home", filled)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("backed up 1 session, 20 messages (schema ")
    assert result.output.endswith(f"to {target}; integrity check ok\n")
    again = run(backup_cmd, target, "--home", filled)
    assert again.exit_code == 1
    assert f"{target} already exists: choose a new file name" in again.output
    nothing = run(backup_cmd, tmp_path / "c.db", "--home", tmp_path / "empty-home")
    assert nothing.exit_code == 1
    assert "no database at" in nothing.output and "nothing to back up" in nothing.output
    assert not (tmp_path / "c.db").exists()


def test_restore_brings_back_the_backup_and_keeps_the_previous_database(filled, tmp_path):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    with SessionDB(filled / "state.db") as db:  # the database moves on after the backup
        sid = db.sessions.create(new_session_id(), "slack")
        db.messages.append(sid, "user", "after the backup")
    result = run(restore_cmd, target, "--home", filled)
    assert result.exit_code == 0, result.output
    assert _messages(filled / "state.db") == [f"m{i}" for i in range(20)]
    previous = [p for p in filled.iterdir() if p.name.startswith("state.db.pre-restore-")]
    assert len(previous) == 1
    assert _messages(previous[0])[-1] == "after the backup"
    assert stat.S_IMODE(previous[0].stat().st_mode) == 0o600
    assert result.output.splitlines() == [
        f"the previous database is kept in {previous[0]}",
        f"restored 1 session, 20 messages (schema {backup_mod.check_file(target).schema_version}) "
        f"from {target} into {filled / 'state.db'}",
    ]
    with SessionDB(filled / "state.db") as db:  # the store opens it and goes on writing
        assert db.messages.count() == 20
        assert db.transfer.stats() is not None


def test_restores_in_the_same_second_keep_each_previous_database_under_its_own_name(filled, tmp_path):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    now = time.time()
    taken = []
    for second in range(-1, 4):  # the names a restore in this second (or the next few) would take
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now + second))
        taken.append(filled / f"state.db.pre-restore-{stamp}")
        taken[-1].write_text("an earlier restore's copy")
    kept = []
    for _ in range(2):
        result = run(restore_cmd, target, "--home", filled)
        assert result.exit_code == 0, result.output
        assert "cannot read" not in result.output and "already exists" not in result.output
        kept.append(Path(result.output.splitlines()[0].removeprefix("the previous database is kept in ")))
    # each took a name of its own: past the taken ones (a numbered one), and not the other's, whether the two
    # restores ran in the same second (-2 and -3) or a loaded machine put them in two (-2 and -2)
    assert kept[0] != kept[1] and not set(kept) & set(taken)
    assert all(p.name.rsplit("-", 1)[1] in {"2", "3"} for p in kept), kept
    assert all(_messages(p) == [f"m{i}" for i in range(20)] for p in kept)
    assert all(p.read_text() == "an earlier restore's copy" for p in taken)  # none overwritten


def test_restore_into_a_fresh_home(filled, tmp_path):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    fresh = tmp_path / "fresh"
    result = run(restore_cmd, target, "--home", fresh)
    assert result.exit_code == 0, result.output
    assert "previous database" not in result.output
    assert _messages(fresh / "state.db") == [f"m{i}" for i in range(20)]
    assert stat.S_IMODE((fresh / "state.db").stat().st_mode) == 0o600


def test_restore_is_refused_while_the_daemon_holds_the_lock(filled, tmp_path):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    with SessionDB(filled / "state.db") as db:
        db.messages.append(db.sessions.list_rich()[0]["id"], "user", "newer")
    before = _messages(filled / "state.db")
    daemon = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(filled)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert daemon.stdout.readline() == "locked\n", daemon.stderr.read()
        result = run(restore_cmd, target, "--home", filled)
    finally:
        daemon.kill()
        daemon.wait(timeout=10)
    assert result.exit_code == 1
    assert result.output == (f"Error: the daemon is running on {filled} (pid {daemon.pid}): stop it first "
                             "(systemctl stop switchboard, or systemctl --user stop switchboard), then restore; "
                             "nothing was changed\n")  # said once, and no `switchboard run --home DIR`
    assert _messages(filled / "state.db") == before
    assert not [p for p in filled.iterdir() if "pre-restore" in p.name]


def _corrupt(path: Path) -> None:
    """Scribble over the cells of the messages table's root page (the schema stays readable)."""
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    conn.close()
    with open(path, "r+b") as fh:
        fh.seek(root * page_size - 400)  # the end of the page, where cell contents sit
        fh.write(b"\xff" * 400)


@pytest.mark.parametrize(
    "spoil, message",
    [
        (_corrupt, "failed its integrity check"),
        (lambda p: p.write_text("not a database at all\n" * 100), "not a usable SQLite database"),
        (lambda p: sqlite3.connect(p).execute("UPDATE schema_version SET version = 999").connection.commit(),
         "newer than this Switchboard understands"),
        (lambda p: p.unlink(), "does not exist or is not a file"),
    ],
    ids=["corrupt", "not-sqlite", "newer-schema", "missing"],
)
def test_restore_refuses_a_bad_file_and_changes_nothing(filled, tmp_path, spoil, message):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    spoil(target)
    before = _messages(filled / "state.db")
    result = run(restore_cmd, target, "--home", filled)
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _messages(filled / "state.db") == before
    assert not [p for p in filled.iterdir() if "pre-restore" in p.name]


def test_restore_over_an_unreadable_database_keeps_its_bytes(filled, tmp_path):
    target = tmp_path / "b.db"
    backup_mod.backup(filled, target)
    live = filled / "state.db"
    for sidecar in ("-wal", "-shm"):
        Path(f"{live}{sidecar}").unlink(missing_ok=True)
    live.write_bytes(b"garbage" * 1000)
    result = run(restore_cmd, target, "--home", filled)
    assert result.exit_code == 0, result.output
    kept = [p for p in filled.iterdir() if p.name.endswith(".raw")]
    assert len(kept) == 1 and kept[0].read_bytes() == b"garbage" * 1000
    assert _messages(live) == [f"m{i}" for i in range(20)]


def test_restore_refuses_the_live_database_itself(filled):
    result = run(restore_cmd, filled / "state.db", "--home", filled)
    assert result.exit_code == 1
    assert "is the live database itself" in result.output


def test_switchboard_backup_and_restore_from_the_installed_command(filled, tmp_path):
    switchboard = Path(sys.executable).parent / "switchboard"
    target = tmp_path / "nightly.db"
    env = {**os.environ, "SWITCHBOARD_HOME": str(filled)}
    made = subprocess.run([switchboard, "backup", target], capture_output=True, text=True, timeout=60, env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("backed up 1 session, 20 messages")
    back = subprocess.run([switchboard, "restore", target], capture_output=True, text=True, timeout=60, env=env)
    assert back.returncode == 0, back.stderr
    assert "restored 1 session, 20 messages" in back.stdout


def test_a_killed_backups_partial_file_is_removed_and_force_replaces_a_backup(filled, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is gone, as a SIGKILLed backup's is
    left = tmp_path / f".old.db.partial-{dead.pid}"
    left.write_bytes(b"half a database")
    mine = tmp_path / f".other.db.partial-{os.getpid()}"  # a live process's (this one): not touched
    mine.write_bytes(b"in progress")
    target = tmp_path / "b.db"
    assert run(backup_cmd, target, "--home", filled).exit_code == 0
    assert not left.exists() and mine.exists()
    refused = run(backup_cmd, target, "--home", filled)
    assert refused.exit_code == 1 and "or pass --force to replace it" in refused.output
    with SessionDB(filled / "state.db") as db:
        db.messages.append(db.sessions.list_rich(limit=1)[0]["id"], "user", "m20")
    forced = run(backup_cmd, target, "--home", filled, "--force")
    assert forced.exit_code == 0, forced.output
    assert _messages(target)[-1] == "m20"


def test_restore_in_a_terminal_asks_first(filled, tmp_path):
    from tests.ptykit import Terminal

    switchboard = Path(sys.executable).parent / "switchboard"
    target = tmp_path / "b.db"
    assert run(backup_cmd, target, "--home", filled).exit_code == 0
    before = (filled / "state.db").read_bytes()
    term = Terminal([str(switchboard), "restore", str(target), "--home", str(filled)], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 30
        while "[y/N]" not in term.text() and time.monotonic() < deadline and term.proc.poll() is None:
            time.sleep(0.05)
        assert f"Replace {filled / 'state.db'}" in term.text(), term.text()
        term.type("n\r")
        assert term.wait(30) == 1
    finally:
        term.close()
    assert "nothing was restored" in term.text()
    assert (filled / "state.db").read_bytes() == before
