"""Online backup and checked restore of the state database.

``backup`` copies the live ``state.db`` with SQLite's online backup API while
the daemon keeps writing: the copy is one consistent snapshot (every
transaction committed before the backup began, none half-done), checked with
``PRAGMA integrity_check``, written mode 0600 as a single self-contained file
(rollback journal mode, no ``-wal`` beside it).

Why the snapshot does not disturb the daemon: the source connection opens one
read transaction before copying and keeps it to the end.  In WAL mode a
reader never blocks writers, so the daemon commits as usual meanwhile; and
because the snapshot stays open between steps, SQLite does not restart the
copy each time another process commits (which it does for a backup that
re-reads the source at every step, and which under a steady stream of writes
would never finish).

``restore`` checks the file first (integrity, that it is a Switchboard store,
a schema this version understands), takes the daemon's lock so no daemon can
run meanwhile, keeps a copy of the current database, then writes the backup
into ``state.db`` through the same API, in one transaction: a failure half-way
leaves the old contents.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from gateway.errors import AlreadyRunning, BackupError
from gateway.runtime import lockfile
from state import schema
from state.errors import DatabaseRefused
from state.paths import DB_FILENAME

log = logging.getLogger(__name__)

PAGES_PER_STEP = 1024  # 4 MiB with 4 KiB pages between progress reports
BUSY_TIMEOUT = 10.0


@dataclass(frozen=True)
class DatabaseSummary:
    path: Path
    schema_version: int
    sessions: int
    messages: int
    size_bytes: int


@dataclass(frozen=True)
class RestoreResult:
    restored: DatabaseSummary  # the live database after the restore
    source: Path
    previous_copy: Path | None  # the database as it was before, or None when there was none


def db_path(home: Path) -> Path:
    return Path(home) / DB_FILENAME


# --- helpers ---------------------------------------------------------------


def _create_private(path: Path) -> None:
    """An empty file with mode 0600; refuses to replace anything."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_readonly(path: Path) -> sqlite3.Connection:
    uri = f"file:{quote(str(path))}?mode=ro"
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT)


def _counts(conn: sqlite3.Connection) -> tuple[int, int]:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0] if "sessions" in tables else 0
    messages = conn.execute("SELECT count(*) FROM messages").fetchone()[0] if "messages" in tables else 0
    return sessions, messages


def _integrity_problems(conn: sqlite3.Connection, pragma: str = "integrity_check") -> list[str]:
    rows = [row[0] for row in conn.execute(f"PRAGMA {pragma}(20)")]
    if rows == ["ok"]:
        return []
    # one problem per line, without SQLite's "*** in database main ***" headings
    return [line.strip() for row in rows for line in str(row).splitlines() if line.strip() and not line.startswith("***")]


def check_file(path: Path) -> DatabaseSummary:
    """Read-only: a full integrity check, then that it is a Switchboard store we can open.

    Raises ``BackupError`` saying what is wrong; the file is not changed.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise BackupError(f"{path} does not exist or is not a file: give the path of a file written by switchboard backup")
    try:
        conn = _open_readonly(path)
    except sqlite3.Error as exc:
        raise BackupError(f"{path} cannot be opened ({exc}): nothing was changed") from exc
    try:
        try:
            problems = _integrity_problems(conn)
        except sqlite3.DatabaseError as exc:
            raise BackupError(f"{path} is not a usable SQLite database ({exc}): nothing was changed") from exc
        if problems:
            raise BackupError(
                f"{path} failed its integrity check ({'; '.join(problems[:3])}): nothing was changed. "
                "Restore an older backup"
            )
        try:
            version = schema.read_version(conn, str(path))
        except DatabaseRefused as exc:
            raise BackupError(str(exc)) from exc
        if version == 0:
            raise BackupError(f"{path} is an empty database, not a backup of one: nothing was changed")
        sessions, messages = _counts(conn)
    finally:
        conn.close()
    return DatabaseSummary(path, version, sessions, messages, path.stat().st_size)


# --- backup ----------------------------------------------------------------

_PARTIAL = re.compile(r"^\..+\.partial-(\d+)(-journal)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_partials(folder: Path) -> list[Path]:
    """Remove the half-written copies (``.NAME.partial-PID``) that backups killed mid-way left in
    ``folder``: those whose process is gone.  Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _PARTIAL.match(path.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
            log.info("removed %s, left by a backup that did not finish", path)
    return removed


def backup(
    home: Path,
    target: Path,
    *,
    pages_per_step: int = PAGES_PER_STEP,
    progress: Callable[[int, int], None] | None = None,
    allow_empty: bool = True,
    force: bool = False,
) -> DatabaseSummary:
    """Copy ``<home>/state.db`` to ``target`` while it is in use; returns what the copy holds.

    ``force`` replaces an existing ``target`` (only once the new copy is whole and checked).  The
    half-written copies a killed backup left in ``target``'s folder (``.NAME.partial-PID`` of a process
    that is gone) are removed first.

    ``progress(remaining, total)`` is called after every step of ``pages_per_step`` pages.
    Unless ``allow_empty``, a database holding no sessions is refused (``BackupError``, no
    file written): it usually means the wrong home.
    """
    source = db_path(home)
    target = Path(target).expanduser().absolute()
    if not source.is_file():
        raise BackupError(f"no database at {source}: nothing to back up (is --home or SWITCHBOARD_HOME right?)")
    if (target.exists() or target.is_symlink()) and not force:
        raise BackupError(f"{target} already exists: choose a new file name, move that file away, "
                          "or pass --force to replace it")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise BackupError(f"{target} is not a regular file: choose another name")
    if not target.parent.is_dir():
        raise BackupError(f"directory {target.parent} does not exist: create it first")
    if target.resolve() == source.resolve():
        raise BackupError(f"{target} is the live database itself: choose another file")
    sweep_partials(target.parent)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    started = time.monotonic()
    src = sqlite3.connect(source, isolation_level=None, timeout=BUSY_TIMEOUT)
    try:
        # the snapshot starts at the first read inside this transaction and
        # holds until COMMIT: every step below copies from it
        src.execute("BEGIN")
        try:
            version = schema.read_version(src, str(source))
        except DatabaseRefused as exc:
            raise BackupError(str(exc)) from exc
        _create_private(partial)
        try:
            dst = sqlite3.connect(partial, isolation_level=None)
            try:
                src.backup(dst, pages=pages_per_step, progress=_progress_reporter(progress))
                src.execute("COMMIT")
                # one self-contained file: no -wal needed beside it
                dst.execute("PRAGMA journal_mode = DELETE")
                problems = _integrity_problems(dst)
                if problems:
                    raise BackupError(f"the copy failed its integrity check ({'; '.join(problems[:3])}); it was deleted")
                sessions, messages = _counts(dst)
            finally:
                dst.close()
            if not sessions and not allow_empty:
                raise BackupError(
                    f"{source} holds no sessions, so no backup was written. If you expected conversations, "
                    "this is not the home the daemon uses: give --home DIR or --config FILE "
                    "(pass --allow-empty to back up an empty database anyway)"
                )
            _fsync(partial)
            os.replace(partial, target)
        finally:
            if partial.exists():
                partial.unlink()
    finally:
        if src.in_transaction:
            src.execute("ROLLBACK")
        src.close()
    log.info("backed up %s to %s in %.2fs (%d messages)", source, target, time.monotonic() - started, messages)
    return DatabaseSummary(target, version, sessions, messages, target.stat().st_size)


def _progress_reporter(progress: Callable[[int, int], None] | None) -> Callable[[int, int, int], None]:
    def report(status: int, remaining: int, total: int) -> None:
        log.debug("backup: %d of %d pages copied", total - remaining, total)
        if progress is not None:
            progress(remaining, total)

    return report


# --- restore ---------------------------------------------------------------


_RAW_SUFFIX = ".raw"


def _free_name(home: Path, name: str) -> Path:
    """``home/name``, or ``name-2``, ``name-3`` ... when a restore in the same second took it (with or
    without its ``.raw`` copy); the caller holds the home's lock, so no other restore races for it."""
    for n in itertools.count(1):
        candidate = home / (name if n == 1 else f"{name}-{n}")
        if not any(p.exists() for p in (candidate, candidate.with_name(candidate.name + _RAW_SUFFIX))):
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def _keep_previous(home: Path, live: Path) -> Path | None:
    """Copy the current database aside before it is replaced; None when there is nothing to keep.

    A readable store is copied with the backup API (``state.db.pre-restore-<time>``);
    one SQLite cannot read (the usual reason to restore) is copied byte for byte,
    with its ``-wal``, as ``state.db.pre-restore-<time>.raw``.
    """
    if not live.exists() or live.stat().st_size == 0:
        return None
    previous = _free_name(home, f"{DB_FILENAME}.pre-restore-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    try:
        backup(home, previous)
        return previous
    except (BackupError, sqlite3.Error) as exc:
        log.warning("cannot read %s as a database (%s); keeping a byte copy instead", live, exc)
    raw = previous.with_name(previous.name + _RAW_SUFFIX)
    for src, dst in ((live, raw), (live.with_name(live.name + "-wal"), raw.with_name(raw.name + "-wal"))):
        if src.exists():
            _create_private(dst)
            shutil.copyfile(src, dst)
    return raw


def _replace_file(source: Path, live: Path) -> None:
    """Build the restored database beside ``live`` and rename it into place."""
    fresh = live.with_name(f".{live.name}.restore-{os.getpid()}")
    _create_private(fresh)
    try:
        src = _open_readonly(source)
        dst = sqlite3.connect(fresh, isolation_level=None)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = WAL")
        finally:
            src.close()
            dst.close()
        _fsync(fresh)
        for sidecar in ("-wal", "-shm"):
            live.with_name(live.name + sidecar).unlink(missing_ok=True)
        os.replace(fresh, live)
    finally:
        fresh.unlink(missing_ok=True)


def _write_into(source: Path, live: Path, previous: Path) -> None:
    """Overwrite the live database's contents in one write transaction (safe beside open readers)."""
    src = _open_readonly(source)
    dst = sqlite3.connect(live, isolation_level=None, timeout=BUSY_TIMEOUT)
    try:
        src.backup(dst, pages=-1)  # one step: all of it or none
        if dst.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            dst.execute("PRAGMA journal_mode = WAL")
    except sqlite3.Error as exc:
        raise BackupError(
            f"restoring {source} into {live} failed ({exc}); the database keeps its old contents, "
            f"and a copy of them is in {previous}"
        ) from exc
    finally:
        src.close()
        dst.close()


def restore(home: Path, source: Path) -> RestoreResult:
    """Replace ``<home>/state.db`` with the checked contents of ``source``; the daemon must be stopped."""
    home = Path(home).expanduser().absolute()
    source = Path(source).expanduser().absolute()
    live = db_path(home)
    if source.exists() and live.exists() and source.resolve() == live.resolve():
        raise BackupError(f"{source} is the live database itself: give the path of a backup file")
    checked = check_file(source)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        lock = lockfile.acquire(home, then="restore")
    except AlreadyRunning as exc:
        raise BackupError(str(exc)) from None
    with lock:
        previous = _keep_previous(home, live)
        if previous is None or previous.name.endswith(_RAW_SUFFIX):
            # no database, or one SQLite cannot read: put a new file in its place
            _replace_file(source, live)
        else:
            _write_into(source, live, previous)
        # a read-write connection only so that closing it checkpoints and removes the -wal
        conn = sqlite3.connect(live, isolation_level=None, timeout=BUSY_TIMEOUT)
        try:
            problems = _integrity_problems(conn, "quick_check")
            if problems:  # pragma: no cover - the source passed a full check a moment ago
                raise BackupError(f"{live} failed its check after the restore ({'; '.join(problems[:3])})")
            sessions, messages = _counts(conn)
        finally:
            conn.close()
    log.info("restored %s from %s (previous copy: %s)", live, source, previous)
    summary = DatabaseSummary(live, checked.schema_version, sessions, messages, live.stat().st_size)
    return RestoreResult(restored=summary, source=source, previous_copy=previous)
