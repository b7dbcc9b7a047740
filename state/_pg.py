"""PostgreSQL: the engine the store's SQL functions run on, one transaction per call.

The store's functions (``state._sessions``, ``_messages``, ...) take a connection and call
``conn.execute(sql, params)`` with the store's SQL, written once with ``$1, $2, ...`` parameters
(``state._sql``) and run on both engines as written.  Here that connection is psycopg's own,
set up by ``state._pg_conn`` (every cursor a ``RawCursor``, so the text goes to the server as it
is; parameters bound there, statements run often prepared there).  Where the dialects truly
differ the module asks its dialect (``state._dialect``).

:class:`PgEngine` is :class:`state._engine.Engine` for PostgreSQL: a
``psycopg_pool.ConnectionPool``, one transaction per call (reads ``REPEATABLE READ``
``READ ONLY``: one snapshot, or a statement alone for a read of one statement, see
:meth:`PgEngine.read`; writes ``READ COMMITTED``, each store function taking the
locks its own read-then-write needs: the rows it goes on to change ``FOR UPDATE``
(``Dialect.for_update``), ``ON CONFLICT`` for what may not exist yet, an advisory lock
(``Dialect.serialize``) where no row stands for the thing; each feature module's
docstring says which.  So writes to different sessions never conflict (``SERIALIZABLE``'s
predicate locks on the small tables' index pages made them fail and retry), and two on
the same rows take turns as SQLite's ``BEGIN IMMEDIATE`` makes them.  A deadlock, or a
serialization failure a function asks for, is still retried with jitter until
``write_timeout``).  A connection found dead (the server restarted) is dropped with the pool's other dead
ones and the call runs again on a new one, unless its COMMIT may have reached the server;
while the server is down a call fails at once with :class:`StoreUnavailable` rather than
waiting out the pool's reconnection.  Opening migrates the schema under a transaction-level advisory lock: of
several processes starting at once on an empty database one migrates, the others
wait and then find it done.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ._dialect import POSTGRES
from ._liveness import connection_kwargs
from .errors import StateError, StoreUnavailable, WriteTimeout

if TYPE_CHECKING:
    from ._pg_conn import StoreConnection
    from .cluster.store import ClusterStore

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMES = ("postgresql", "postgres")
#: The key of the advisory lock held (per transaction) while the schema migrates.
MIGRATION_LOCK = 0x5357_4200_0001  # "SWB" and 1
#: Seconds a call waits for a pooled connection before asking the server directly whether it is up,
#: and the longest that direct try may take (a host that drops packets rather than refusing).
PROBE_AFTER = 0.5
PROBE_TIMEOUT = 3
#: Seconds the pool retries a lost connection in the background before giving up; the next call
#: that finds no connection starts a new try at once, so a server back after a long outage is
#: reached without waiting out a long backoff.
RECONNECT_GIVE_UP = 2.0


def is_url(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL store (``postgresql://...``) rather than a SQLite file."""
    return isinstance(target, str) and target.split("://", 1)[0].lower() in SCHEMES and "://" in target


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs, errors, /healthz, doctor, exports)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://***"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))


def _without_secret(text: str, url: str) -> str:
    """An error text with the URL's password taken out, wherever a driver may have put it."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


# --- the connection wrapper -------------------------------------------------------------------

def _stale_plan(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL refusing a prepared statement whose table changed shape since."""
    return "cached plan must not change result type" in str(exc)


# --- the engine ---------------------------------------------------------------------------------


def _require_psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401 - checked here so the error names both
    except ImportError as exc:
        raise StoreUnavailable(
            "postgresql://...", "psycopg is not installed: pip install 'switchboard[postgresql]'"
        ) from exc
    return psycopg


class PgEngine:
    """Owns the connection pool; runs each store function in one transaction (see module docstring)."""

    dialect = POSTGRES

    def __init__(self, url: str, *, write_timeout: float = 10.0, pool_size: int = 8, connect_timeout: float = 10.0):
        _require_psycopg()
        from psycopg_pool import ConnectionPool

        from ._pg_conn import StoreConnection, configure

        self.url = url
        self.masked_url = mask_url(url)
        self.write_timeout = float(write_timeout)
        self.connect_timeout = max(1, int(connect_timeout))
        self._closed = False
        self._server_down = False  # the last direct try found the server unreachable (see _connection)
        self._multi_statement_reads: set[Any] = set()  # the code of reads that ran more than one statement

        self._pool = ConnectionPool(
            url, min_size=1, max_size=max(1, int(pool_size)), open=False,
            connection_class=StoreConnection, configure=configure,
            # keepalives and a statement timeout: a partition fails a statement within seconds (state._liveness)
            kwargs={"autocommit": False, "connect_timeout": self.connect_timeout, **connection_kwargs(url)},
            name="switchboard-store", timeout=max(self.write_timeout, 1.0), reconnect_timeout=RECONNECT_GIVE_UP,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except Exception as exc:  # noqa: BLE001 - the pool says only "timeout"; _reason asks the server why
            self._pool.close()
            raise StoreUnavailable(self.masked_url, self._reason(exc)) from None
        try:
            self._open_schema()
        except BaseException:
            self._pool.close()
            raise

    def _reason(self, exc: BaseException) -> str:
        """Why a connection failed, without the password; the pool's own error says little, so ask once."""
        return self._unreachable() or _without_secret(str(exc).strip() or type(exc).__name__, self.url)

    def _unreachable(self) -> str | None:
        """Connect to the server directly, past the pool: None when that works, else why not (no password)."""
        import psycopg

        try:
            psycopg.connect(self.url, connect_timeout=min(PROBE_TIMEOUT, self.connect_timeout)).close()
        except Exception as exc:  # noqa: BLE001 - any failure is the reason we want to show
            return _without_secret(str(exc).strip() or type(exc).__name__, self.url)
        return None

    # --- schema ---------------------------------------------------------------

    def _open_schema(self) -> None:
        from . import schema

        def check(conn: StoreConnection) -> int:
            return schema.read_version_pg(conn, self.masked_url)

        if self.read(check) >= schema.current_version():
            return

        def migrate(conn: StoreConnection) -> None:
            conn.execute("SET LOCAL statement_timeout = 0")  # a step may rewrite a large table
            conn.execute("SELECT pg_advisory_xact_lock($1)", (MIGRATION_LOCK,))
            version = schema.read_version_pg(conn, self.masked_url)  # another process may have migrated meanwhile
            if version < schema.current_version():
                log.info("migrating %s from schema %d to %d", self.masked_url, version, schema.current_version())
                schema.migrate_pg(conn, version)

        # Read committed: after the lock is ours, the version read sees what another migration committed.
        self._run(migrate, (), {}, isolation="READ COMMITTED", read_only=False, deadline=time.monotonic() + 600)

    # --- transactions ------------------------------------------------------------

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, ...)`` in one read-only snapshot.

        A read of one statement needs no transaction around it (a statement sees one snapshot of its
        own), and ``BEGIN`` and ``COMMIT`` would be two of its three round trips: so a store function
        is first run as a statement alone.  Should it run a second one, it is run again from the start
        in a ``REPEATABLE READ READ ONLY`` transaction, and is remembered (by its code) as needing one
        from then on.  Nothing is lost by the first try: a read changes nothing."""
        from ._pg_conn import NotOneStatement

        deadline = time.monotonic() + self.write_timeout
        code = getattr(getattr(fn, "func", fn), "__code__", None)
        if code is not None and code not in self._multi_statement_reads:
            try:
                return self._run(fn, args, kwargs, isolation="REPEATABLE READ", read_only=True, deadline=deadline,
                                 one_statement=True)
            except NotOneStatement:
                self._multi_statement_reads.add(code)
        return self._run(fn, args, kwargs, isolation="REPEATABLE READ", read_only=True, deadline=deadline)

    def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(conn, ...)`` in one ``READ COMMITTED`` transaction: all of it or none.

        ``fn`` takes the row and advisory locks its reads need (see the module docstring).  A
        deadlock or a serialization failure runs it again, with jitter, until ``write_timeout``
        seconds have passed; then :class:`WriteTimeout` is raised with nothing written.
        """
        return self._run(fn, args, kwargs, isolation="READ COMMITTED", read_only=False,
                         deadline=time.monotonic() + self.write_timeout)

    def write_committed(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """:meth:`write` (the name the cluster's statements, ``state.cluster.store``, and the budgets'
        admission were written against when other writes ran ``SERIALIZABLE``)."""
        return self._run(fn, args, kwargs, isolation="READ COMMITTED", read_only=False,
                         deadline=time.monotonic() + self.write_timeout)

    def reserve_connections(self, count: int) -> None:
        """Grow the pool by ``count`` connections (shrink it back with a negative ``count``)."""
        pool = self._pool
        pool.resize(pool.min_size, max(1, pool.max_size + int(count)))

    @functools.cached_property
    def cluster(self) -> ClusterStore:
        """The cluster's coordination on this store (``state.cluster.ClusterStore``)."""
        from .cluster.store import ClusterStore

        return ClusterStore(self)

    def write_giving_way(self, fn: Callable[..., T], /, *args: Any) -> T:
        """:meth:`write`: PostgreSQL's writers do not queue behind one another's transactions (only
        behind the rows they share), so an upkeep step has nothing to give way to."""
        return self.write(fn, *args)

    def _run(self, fn: Callable[..., T], args: tuple, kwargs: dict, *, isolation: str, read_only: bool,
             deadline: float, one_statement: bool = False) -> T:
        """``fn`` in one transaction, run again on a serialization failure or a deadlock (until the deadline)
        and once on a connection found dead when nothing it did can have been committed: it failed before
        its COMMIT was sent, or it only read.  ``one_statement`` (a read): no transaction, and
        :class:`~state._pg_conn.NotOneStatement` if ``fn`` runs a second statement."""
        import psycopg
        from psycopg import errors as pgerrors
        from psycopg_pool import PoolTimeout

        if self._closed:
            raise StateError("the state store is closed: open a new SessionDB")
        start = time.monotonic()
        delay = 0.002
        reconnected = False
        replanned = False
        while True:
            raw = None
            committing = False
            try:
                with self._connection(deadline) as raw:
                    raw.isolation_level = getattr(psycopg.IsolationLevel, isolation.replace(" ", "_"))
                    raw.read_only = read_only
                    try:
                        if one_statement:
                            raw.autocommit = True
                            raw.alone(True)
                            try:
                                result = fn(raw, *args, **kwargs)
                            finally:
                                raw.alone(False)
                                if not raw.closed and not raw.broken:
                                    raw.autocommit = False
                            self._server_down = False
                            return result
                        try:
                            result = fn(raw, *args, **kwargs)
                            committing = True
                            raw.commit()
                            self._server_down = False
                            return result
                        except BaseException:
                            if not raw.closed:
                                raw.rollback()
                            raise
                    except pgerrors.FeatureNotSupported as exc:
                        if replanned or not _stale_plan(exc) or raw.closed:
                            raise
                        # A statement this connection prepared before another process changed a table's
                        # columns (a newer instance migrating the schema): forget its prepared
                        # statements and run the call again, once; nothing was committed.
                        raw.execute("DEALLOCATE ALL")
                        raw.commit()
                        replanned = True
                        continue
            except (pgerrors.SerializationFailure, pgerrors.DeadlockDetected) as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WriteTimeout(self.masked_url, time.monotonic() - start) from exc
                time.sleep(min(remaining, random.uniform(0.5, 1.5) * delay))
                delay = min(delay * 2, 0.1)
            except PoolTimeout as exc:
                raise WriteTimeout(self.masked_url, time.monotonic() - start) from exc
            except psycopg.OperationalError as exc:
                reason = _without_secret(str(exc).strip(), self.url)
                lost = raw is not None and raw.broken
                if lost and committing and not read_only:
                    raise StoreUnavailable(self.masked_url, (
                        f"the connection was lost while committing ({reason}), so this change may or may not "
                        "have been stored; look before doing it again")) from None
                if lost and not reconnected:
                    # Nothing was committed (no COMMIT was sent, or the transaction only read): a server
                    # restart ended the pool's connections.  Drop every dead one and run the call again.
                    log.warning("the connection to %s was lost (%s); running the call again on a new one",
                                self.masked_url, reason)
                    reconnected = True
                    self._pool.check()
                    continue
                raise StoreUnavailable(self.masked_url, reason) from None

    @contextmanager
    def _connection(self, deadline: float) -> Iterator[Any]:
        """A connection from the pool, or :class:`StoreUnavailable` at once when the server cannot be reached.

        The pool reconnects in the background and would keep a caller waiting until the deadline; so
        after a short wait (or before waiting, when the server was found down last time) the server is
        asked directly.  Reachable: the pool is only busy or reconnecting, so wait on."""
        from psycopg_pool import PoolTimeout

        pool = self._pool
        if self._server_down:
            self._check_reachable()
        try:
            raw = pool.getconn(timeout=max(0.01, min(PROBE_AFTER, deadline - time.monotonic())))
        except PoolTimeout:
            if time.monotonic() >= deadline:
                raise
            self._check_reachable()
            raw = pool.getconn(timeout=max(0.01, deadline - time.monotonic()))
        try:
            yield raw
        finally:
            pool.putconn(raw)

    def _check_reachable(self) -> None:
        reason = self._unreachable()
        self._server_down = reason is not None
        if reason is not None:
            raise StoreUnavailable(self.masked_url, reason)

    # --- what SQLite's engine also offers ---------------------------------------------

    def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        """PostgreSQL checkpoints on its own; nothing to do (SQLite's answer for 'nothing pending')."""
        return (0, 0, 0)

    def checkpoint_aside(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        return (0, 0, 0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()


def probe(url: str, *, timeout: float = 5.0) -> tuple[int | None, str]:
    """Reach the PostgreSQL store without changing it (``doctor``): (schema version, 0 when not
    migrated yet, or None when it cannot be used; what was found, the URL's password masked)."""
    from . import schema

    psycopg = _require_psycopg()
    from ._pg_conn import StoreConnection, configure

    masked = mask_url(url)
    try:
        with StoreConnection.connect(url, connect_timeout=max(1, int(timeout))) as conn:
            configure(conn)
            version = schema.read_version_pg(conn, masked)
            server = conn.info.server_version
    except psycopg.Error as exc:
        return None, f"{masked}: {_without_secret(str(exc).strip(), url)}"
    except StateError as exc:
        return None, str(exc)
    return version, f"{masked} (PostgreSQL {server // 10000}.{server % 10000})"
