"""Connections and transactions: the one place that talks to sqlite3 directly.

Every public method of :class:`state.SessionDB` is a plain function taking a
connection, run either by :meth:`Engine.write` (one write connection, one
``BEGIN IMMEDIATE`` transaction, patience measured in seconds) or by
:meth:`Engine.read` (a connection per thread, one snapshot).  The async
facade runs the same calls on its own threads, so there is one
implementation.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from . import _ownership, schema
from ._integrity import is_corruption
from ._lock import HELD_BACK_AT_MOST, STARVING_AFTER_TRIES, GaveWay, StarvingFlag
from ._sql import NumberedConnection
from .errors import NotADatabase, StateError, StoreCorrupt, WriteTimeout
from .paths import prepare_db_file

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_EVERY = 50  # writes between PASSIVE checkpoints (run by a background thread)
# SQLite's own checkpoint-at-commit threshold, in WAL pages, for our write connection.  The
# background checkpointer does the copying and the fsyncs while writers keep writing; a
# writer checkpoints itself (holding the write lock for two fsyncs) only when the WAL passes
# this size, which under steady load the background thread rarely lets happen.
WAL_AUTOCHECKPOINT_PAGES = 4000
_BUSY = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary codes)
_INTERRUPT = 9  # SQLITE_INTERRUPT
# a busy write tries again after 0.5-1.5 times this: a free lock is found within about a millisecond
# (a waiting writer costs about 2 % of a core)
RETRY_SECONDS = 0.001
GIVE_WAY_CHECK_OPS = 1000  # virtual-machine steps between two looks for a waiting writer (tens of µs; each look takes the GIL)


def _is_interrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (code & 0xFF) == _INTERRUPT if code is not None else "interrupted" in str(exc)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY
    return "locked" in str(exc) or "busy" in str(exc)


class Engine:
    """Owns the write connection, the per-thread read connections and the write lock."""

    def __init__(self, path: Path, *, write_timeout: float = 10.0):
        self.path = Path(path)
        self.write_timeout = float(write_timeout)
        self._write_mutex = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_mutex = threading.Lock()
        self._writes = 0
        self._closed = False
        self._wconn: sqlite3.Connection | None = None
        self._flag: StarvingFlag | None = None
        self._checkpoint_due = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self._aside: sqlite3.Connection | None = None  # for checkpoint_aside()
        self._waiting = 0  # writes (not giving way) waiting for the write mutex: a giving-way write stops
        self._waiting_mutex = threading.Lock()
        self._aside_mutex = threading.Lock()
        self._refused: StoreCorrupt | None = None  # set once the file is found damaged: no write runs after
        prepare_db_file(self.path)
        _ownership.refuse_foreign(self.path, schema.core_columns)  # before any write connection: another program's file stays as it is
        self._wconn = self._connect(timeout=0.0)
        try:
            self._open_schema(self._wconn)
        except BaseException:
            self._wconn.close()
            self._wconn = None
            raise
        try:
            self._flag = StarvingFlag(self.path)
        except OSError as exc:  # read-only directory: SQLite's lock alone still keeps writes safe
            log.warning("no lock file next to %s (%s); writes still work, a writer may wait longer under contention",
                        self.path, exc)

    # --- connections -------------------------------------------------------

    def _connect(self, *, timeout: float) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False,
                                   factory=NumberedConnection)
        except sqlite3.Error as exc:
            raise NotADatabase(str(self.path), f"cannot be opened ({exc})") from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise NotADatabase(str(self.path)) from exc
        return conn

    def _open_schema(self, conn: sqlite3.Connection) -> None:
        """Check the version (reading only); migrate under the write lock only when due."""
        version = self._retry_busy(lambda: schema.read_version(conn, str(self.path)), time.monotonic() + self.write_timeout)
        if version < schema.current_version():
            if version == 0:
                # A new database returns the pages a prune frees (``PRAGMA incremental_vacuum``, run
                # by the daemon's upkeep).  Only possible before the first table, and before WAL
                # mode, which writes the file's header.
                self._retry_busy(lambda: conn.execute("PRAGMA auto_vacuum = INCREMENTAL"),
                                 time.monotonic() + self.write_timeout)
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"), time.monotonic() + self.write_timeout)
            self._begin_immediate(conn, time.monotonic() + self.write_timeout, time.monotonic())
            try:
                again = schema.read_version(conn, str(self.path))  # another process may have migrated meanwhile
                if again < schema.current_version():
                    log.info("migrating %s from schema %d to %d", self.path, again, schema.current_version())
                    schema.migrate(conn, again)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StateError("the state store is closed: open a new SessionDB")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(timeout=self.write_timeout)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._readers_mutex:
                self._readers.append(conn)
        return conn

    # --- transactions ------------------------------------------------------

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, ...)`` on this thread's read connection, inside one snapshot."""
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            return fn(conn, *args, **kwargs)
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, ...)`` in one ``BEGIN IMMEDIATE`` transaction: all of it or none.

        Waits for other writers up to ``write_timeout`` seconds in total, then
        raises :class:`WriteTimeout` with nothing written.  A write that gives way
        (:meth:`write_giving_way`, the store's upkeep) is interrupted so this one goes first.
        """
        return self._write(fn, args, kwargs, gives_way=False)

    def write_giving_way(self, fn: Callable[..., T], /, *args: Any) -> T:
        """:meth:`write` for work that can wait: a write from another thread that comes while
        ``fn`` runs interrupts it, the transaction is rolled back and :class:`GaveWay` raised,
        and that write takes the lock at once instead of waiting for ``fn`` to finish.

        Only ``fn``'s statements can be interrupted, never its COMMIT; a write that comes
        while ``fn`` runs Python between two statements waits for its next statement to start.
        """
        return self._write(fn, args, {}, gives_way=True)

    def refuse_writes(self, problems: list[str]) -> StoreCorrupt:
        """From now on every write raises :class:`StoreCorrupt` (reads go on): the integrity guard
        found the file damaged, and a write could spread the damage.  Returns the error."""
        if self._refused is None:
            self._refused = StoreCorrupt(str(self.path), problems)
        return self._refused

    @property
    def writes_refused(self) -> StoreCorrupt | None:
        return self._refused

    def _write(self, fn: Callable[..., T], args: tuple, kwargs: dict, *, gives_way: bool) -> T:
        if self._refused is not None:
            raise self._refused
        if not self._write_mutex.acquire(blocking=False):
            if gives_way:
                self._write_mutex.acquire()
            else:
                with self._waiting_mutex:
                    self._waiting += 1
                try:
                    self._write_mutex.acquire()
                finally:
                    with self._waiting_mutex:
                        self._waiting -= 1
        try:
            if self._closed or self._wconn is None:
                raise StateError("the state store is closed: open a new SessionDB")
            conn = self._wconn
            start = time.monotonic()
            deadline = start + self.write_timeout

            def transaction() -> T:
                self._begin_immediate(conn, deadline, start)
                try:
                    result = self._giving_way_run(fn, conn, args, kwargs) if gives_way else fn(conn, *args, **kwargs)
                    self._retry_busy(lambda: conn.execute("COMMIT"), deadline)
                    return result
                except BaseException as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if gives_way and isinstance(exc, sqlite3.OperationalError) and _is_interrupt(exc):
                        raise GaveWay() from exc
                    raise

            try:
                result = transaction()
            except sqlite3.DatabaseError as exc:
                if not is_corruption(exc):
                    raise
                log.error("a write found %s damaged (%s): new writes are refused from now on, reads still work; "
                          "stop the daemon and run 'switchboard restore BACKUP_FILE'", self.path, exc)
                raise self.refuse_writes([str(exc)]) from exc
            self._writes += 1
            if self._writes % CHECKPOINT_EVERY == 0:
                self._request_checkpoint()
            return result
        finally:
            self._write_mutex.release()

    def _giving_way_run(self, fn: Callable[..., T], conn: sqlite3.Connection, args: tuple, kwargs: dict) -> T:
        # SQLite calls the handler every GIVE_WAY_CHECK_OPS virtual-machine steps of fn's statements
        # (and of the statements FTS5 runs inside them); a true answer interrupts the statement.
        # Not sqlite3_interrupt(): an interrupt that lands between two statements stays pending
        # while any statement is open (FTS5 keeps its own open) and would hit the next write.
        conn.set_progress_handler(self._someone_waits, GIVE_WAY_CHECK_OPS)
        try:
            return fn(conn, *args, **kwargs)
        finally:
            conn.set_progress_handler(None, 0)

    def _someone_waits(self) -> int:
        return self._waiting

    def _begin_immediate(self, conn: sqlite3.Connection, deadline: float, start: float) -> None:
        """Take SQLite's write lock, trying again after short random sleeps while it is busy, until ``deadline``.

        A write that has found the lock held :data:`STARVING_AFTER_TRIES` times raises its flag
        (``state/_lock.py``), which holds back the other writers until it is in: none cuts in before it
        again and again.
        """
        flag = self._flag
        lost = 0  # tries that found SQLite's lock held
        try:
            while True:
                if flag is None or flag.raised or time.monotonic() - start >= HELD_BACK_AT_MOST \
                        or not flag.up_elsewhere():
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                        return
                    except sqlite3.OperationalError as exc:
                        if not _is_busy(exc):
                            raise
                    lost += 1
                now = time.monotonic()
                if now >= deadline:
                    raise WriteTimeout(str(self.path), now - start)
                if flag is not None and not flag.raised and lost >= STARVING_AFTER_TRIES:
                    flag.raise_()
                time.sleep(min(deadline - now, random.uniform(0.5, 1.5) * RETRY_SECONDS))  # jitter: no lock-step
        finally:
            if flag is not None:
                flag.lower()

    def _retry_busy(self, op: Callable[[], Any], deadline: float) -> Any:
        """Retry ``op`` while the database is busy, with random jitter, until ``deadline``."""
        while True:
            try:
                return op()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WriteTimeout(str(self.path), self.write_timeout) from exc
                time.sleep(min(remaining, random.uniform(0.5, 1.5) * RETRY_SECONDS))

    # --- maintenance -------------------------------------------------------

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> tuple[int, int, int]:
        try:
            row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            return tuple(row)  # (busy, wal pages, checkpointed pages)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                return (1, -1, -1)
            raise

    def _request_checkpoint(self) -> None:
        """Wake the checkpointer: a checkpoint fsyncs twice, which no writer should wait for."""
        if self._checkpointer is None:
            self._checkpointer = threading.Thread(target=self._run_checkpoints, name=f"state-checkpoint:{self.path.name}",
                                                  daemon=True)
            self._checkpointer.start()
        self._checkpoint_due.set()

    def _run_checkpoints(self) -> None:
        conn = self._connect(timeout=0.0)
        try:
            while True:
                self._checkpoint_due.wait()
                self._checkpoint_due.clear()
                if self._closed:
                    return
                try:
                    self._checkpoint(conn, "PASSIVE")
                except sqlite3.Error as exc:  # never fatal: SQLite's own auto-checkpoint is the safety net
                    log.warning("checkpoint of %s failed: %s", self.path, exc)
        finally:
            conn.close()

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        mode = mode.upper()
        if mode not in {"PASSIVE", "FULL", "RESTART", "TRUNCATE"}:
            raise ValueError(f"checkpoint mode must be PASSIVE, FULL, RESTART or TRUNCATE, not {mode!r}")
        with self._write_mutex:
            if self._wconn is None:
                raise StateError("the state store is closed: open a new SessionDB")
            return self._checkpoint(self._wconn, mode)

    def checkpoint_aside(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """A checkpoint on a connection of its own, so writers never queue behind it in this
        process (a PASSIVE one runs beside them; a TRUNCATE one makes them retry while it runs)."""
        mode = mode.upper()
        if mode not in {"PASSIVE", "TRUNCATE"}:
            raise ValueError(f"checkpoint mode must be PASSIVE or TRUNCATE, not {mode!r}")
        with self._aside_mutex:
            if self._closed:
                raise StateError("the state store is closed: open a new SessionDB")
            if self._aside is None:
                self._aside = self._connect(timeout=0.0)
            return self._checkpoint(self._aside, mode)

    def close(self) -> None:
        with self._aside_mutex:
            if self._aside is not None:
                self._aside.close()
                self._aside = None
        with self._write_mutex:
            if self._closed:
                return
            self._closed = True
            if self._checkpointer is not None:
                self._checkpoint_due.set()
                self._checkpointer.join(timeout=self.write_timeout)
            if self._wconn is not None:
                try:
                    self._checkpoint(self._wconn, "PASSIVE")
                except sqlite3.Error:
                    pass
                self._wconn.close()
                self._wconn = None
            if self._flag is not None:
                self._flag.close()
        with self._readers_mutex:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
