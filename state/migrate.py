"""Moving a SQLite store into PostgreSQL: plan, copy, verify (``switchboard migrate --to URL``).

    plan = plan_migration(home / "state.db", url)     # tables, rows, what is in the way
    copy_tables(plan, url, on_rows=...)                # batches, one transaction each
    result = verify_migration(home / "state.db", url)  # row counts and a sample of searches

The tables copied are read from the SQLite schema, not listed here: every table of the
store but SQLite's own (``sqlite_*``), the FTS5 search indexes (virtual tables and their
shadow tables) and the search index's batch mark (``search_index_*``), and
``schema_version`` (the target migrates itself to the same version).  The PostgreSQL
schema has the same tables and columns by design; a copied table or column missing
there stops the copy before anything is written.  PostgreSQL's search index
(``messages_fts``) is filled by its trigger on ``messages`` as the rows arrive; the
fact index is an expression index.  Ids are kept, and the identity sequences are
moved past the copied ids (and past SQLite's ``AUTOINCREMENT`` high-water mark, so an
id deleted before the move is not given out again).

Tables go in an order that satisfies the foreign keys (a referenced table first; the
rows of a table referring to itself, ``sessions`` by ``parent_session_id``, parents
first), in batches of ``batch_size`` rows through ``COPY``, each batch its own
transaction.  The source is read in one snapshot.

What is in the way (:meth:`MigrationPlan.problems`): source rows whose foreign key points at
nothing (PostgreSQL would refuse them half-way), a target whose store tables hold
rows (unless ``replace``: they are emptied first, in one transaction), and other
clients connected to the target database: a running daemon always keeps a connection
open there (its pool), so a database with other connections is in use.  The caller
(the CLI) also holds the SQLite home's daemon lock for the whole copy.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from . import schema
from ._pg import _require_psycopg, _without_secret, is_url, mask_url
from ._sql import NumberedConnection
from .errors import MigrationRefused, StateError
from .search._query import CJK_RANGES

#: Tables of SQLite's search index that are not FTS5 shadow tables: the batch mark and its version.
SEARCH_INDEX_PREFIX = "search_index_"
BATCH_SIZE = 5000
#: A search sample query is compared only when SQLite finds fewer hits than this (all of them, so
#: ranking differences between the engines cannot change which sessions are shown).
SEARCH_LIMIT = 200


@dataclass(frozen=True)
class TablePlan:
    name: str
    columns: tuple[str, ...]
    rows: int
    #: rows the target holds already (None: the target has no such table yet)
    target_rows: int | None


@dataclass(frozen=True)
class MigrationPlan:
    source: Path
    target: str  # the URL, password masked
    source_version: int
    target_version: int  # 0: an empty database
    tables: list[TablePlan]  # in copy order
    skipped: list[str]  # SQLite's own tables (its search indexes), not copied
    clients: list[str] = field(default_factory=list)  # other connections to the target database
    #: rows referring to a row that is not there (table -> how many): PostgreSQL would refuse them
    dangling: dict[str, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def target_rows(self) -> int:
        return sum(t.target_rows or 0 for t in self.tables)

    def problems(self, replace: bool = False) -> list[str]:
        """Why the copy must not start (each says what to do); empty when it may."""
        found = []
        if self.dangling:
            held = ", ".join(f"{n} in {t}" for t, n in sorted(self.dangling.items()))
            found.append(f"{self.source} has rows referring to rows that are gone ({held}; "
                         "PRAGMA foreign_key_check lists them), which PostgreSQL would refuse: delete or "
                         "repair them first")
        if self.clients:
            found.append(
                f"{len(self.clients)} other connection{'s' if len(self.clients) != 1 else ''} to the target database "
                f"({', '.join(self.clients[:5])}): a daemon or another client is using it; stop every "
                "switchboard instance using it (and close other sessions) first")
        if self.target_rows and not replace:
            held = ", ".join(f"{t.name} {t.target_rows}" for t in self.tables if t.target_rows)
            found.append(f"the target store is not empty ({held}): point --to at an empty database, or give "
                         "--replace to delete what it holds and copy this home over it")
        return found


@dataclass(frozen=True)
class TableCheck:
    name: str
    source_rows: int
    target_rows: int

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows


@dataclass(frozen=True)
class SearchCheck:
    query: str
    source_sessions: tuple[str, ...]
    target_sessions: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.source_sessions == self.target_sessions


@dataclass(frozen=True)
class Verification:
    tables: list[TableCheck]
    searches: list[SearchCheck]

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables) and all(s.ok for s in self.searches)


def is_target_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return is_url(url)


# --- reading the source -------------------------------------------------------------------------


def _open_source(path: Path) -> sqlite3.Connection:
    if not Path(path).exists():
        raise MigrationRefused(f"no database at {path}: nothing to migrate (give the home with --home)")
    conn = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None,
                           factory=NumberedConnection)  # a store connection: the store's SQL binds $n by number
    conn.row_factory = None
    return conn


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _source_tables(conn: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """(tables to copy, SQLite's own tables left out), both sorted by name."""
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
    copy: list[str] = []
    skipped: list[str] = []
    for name, _sql in rows:
        if name.startswith("sqlite_") or name == "schema_version":
            continue
        own = (name in virtual or any(name.startswith(v + "_") for v in virtual)
               or name.startswith(SEARCH_INDEX_PREFIX))
        (skipped if own else copy).append(name)
    return copy, skipped


def _references(conn: sqlite3.Connection, table: str) -> list[tuple[str, str, str]]:
    """The table's foreign keys: (referenced table, column here, referenced column)."""
    out = []
    for row in conn.execute(f"PRAGMA foreign_key_list({_q(table)})"):
        referenced, here, there = row[2], row[3], row[4]
        out.append((referenced, here, there or "id"))
    return out


def _copy_order(conn: sqlite3.Connection, tables: list[str]) -> list[str]:
    """Referenced tables before the tables referring to them (by name among equals)."""
    deps = {t: {ref for ref, _, _ in _references(conn, t) if ref != t and ref in tables} for t in tables}
    ordered: list[str] = []
    while deps:
        ready = sorted(t for t, needs in deps.items() if not needs - set(ordered))
        if not ready:  # a cycle between tables: our schema has none; copy the rest by name
            ready = sorted(deps)
        for t in ready:
            ordered.append(t)
            del deps[t]
    return ordered


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({_q(table)})"))


def _select(conn: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> str:
    """The SELECT reading a table's rows in copy order: parents first for a table referring to itself."""
    cols = ", ".join(f"t.{_q(c)}" for c in columns)
    for referenced, here, there in _references(conn, table):
        if referenced == table:
            return (f"WITH RECURSIVE tree(key, depth) AS (SELECT {_q(there)}, 0 FROM {_q(table)} WHERE {_q(here)} IS NULL "
                    f"UNION ALL SELECT c.{_q(there)}, tree.depth + 1 FROM {_q(table)} c "
                    f"JOIN tree ON c.{_q(here)} = tree.key) "
                    f"SELECT {cols} FROM {_q(table)} t JOIN tree ON t.{_q(there)} = tree.key ORDER BY tree.depth, t.rowid")
    return f"SELECT {cols} FROM {_q(table)} t"


# --- the target ---------------------------------------------------------------------------------


def _connect(url: str) -> Any:
    _require_psycopg()
    from ._pg_conn import StoreConnection, configure

    try:
        conn = StoreConnection.connect(url, connect_timeout=10, autocommit=True)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported the same way
        reason = _without_secret(str(exc).strip() or type(exc).__name__, url)
        raise MigrationRefused(f"cannot reach the target {mask_url(url)}: {reason}; check the --to URL (host, port, "
                               "user, password, database) and that the server accepts this user") from None
    configure(conn)
    return conn


def _target_version(pg: Any, url: str) -> int:
    return schema.read_version_pg(pg, mask_url(url))


def _target_tables(pg: Any) -> dict[str, dict[str, str]]:
    """The target's tables: name -> {column: data type}."""
    tables: dict[str, dict[str, str]] = {}
    for table, column, kind in pg.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema()"):
        tables.setdefault(table, {})[column] = kind
    return tables


def _clients(pg: Any) -> list[str]:
    """The other connections to this database, as ``application (user@address)``."""
    rows = pg.execute(
        "SELECT application_name, usename, client_addr FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY backend_start").fetchall()
    return [f"{app or 'a client'} ({user or '?'}@{addr or 'local socket'})" for app, user, addr in rows]


def plan_migration(source: Path, url: str) -> MigrationPlan:
    """What a copy of ``source`` into ``url`` would do; reads both, writes neither."""
    masked = mask_url(url)
    conn = _open_source(source)
    try:
        source_version = schema.read_version(conn, str(source))
        names, skipped = _source_tables(conn)
        order = _copy_order(conn, names)
        counts = {t: conn.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in order}
        columns = {t: _columns(conn, t) for t in order}
        dangling: dict[str, int] = {}
        for row in conn.execute("PRAGMA foreign_key_check"):
            if row[0] in counts:
                dangling[row[0]] = dangling.get(row[0], 0) + 1
    except sqlite3.DatabaseError as exc:
        raise MigrationRefused(f"cannot read {source}: {exc}") from None
    finally:
        conn.close()
    with _connect(url) as pg:
        try:
            target_version = _target_version(pg, url)
        except StateError as exc:
            raise MigrationRefused(str(exc)) from None
        present = _target_tables(pg) if target_version else {}
        held = {t: pg.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in order if t in present}
        clients = _clients(pg)
    tables = [TablePlan(t, columns[t], counts[t], held.get(t)) for t in order]
    return MigrationPlan(source=Path(source), target=masked, source_version=source_version,
                         target_version=target_version, tables=tables, skipped=skipped, clients=clients,
                         dangling=dangling)


def prepare_target(plan: MigrationPlan, url: str, *, replace: bool = False) -> None:
    """Bring the target's schema to the current version and check it holds every copied table and
    column; with ``replace``, empty the copied tables (one transaction).  Refuses, writing nothing
    to the rows, when :meth:`MigrationPlan.problems` finds any."""
    problems = plan.problems(replace)
    if problems:
        raise MigrationRefused("; ".join(problems) + "; nothing was copied")
    from .db import SessionDB

    SessionDB(url).close()  # creates or migrates the schema (one process at a time)
    with _connect(url) as pg:
        present = _target_tables(pg)
        for table in plan.tables:
            missing = [c for c in table.columns if c not in present.get(table.name, {})]
            if missing:
                raise MigrationRefused(f"the target has no {'table' if table.name not in present else 'column'} "
                                       f"{table.name}{'' if table.name not in present else '.' + missing[0]}: "
                                       "its schema does not match this Switchboard's; nothing was copied")
        if replace and plan.tables:
            with pg.transaction():
                pg.execute("TRUNCATE " + ", ".join(_q(t.name) for t in plan.tables) + " RESTART IDENTITY CASCADE")


def _coerce(kind: str) -> Callable[[Any], Any]:
    """A SQLite value as the PostgreSQL column of type ``kind`` takes it (SQLite types by value)."""
    if kind in ("bigint", "integer", "smallint"):
        return lambda v: int(v) if isinstance(v, float) and v.is_integer() else v
    if kind == "bytea":
        return lambda v: v.encode() if isinstance(v, str) else v
    if kind == "text":
        def text(v: Any) -> Any:
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            return v.replace("\x00", "\ufffd") if isinstance(v, str) and "\x00" in v else v  # text holds no NUL
        return text
    return lambda v: v


def _batches(cursor: sqlite3.Cursor, size: int) -> Iterator[list[tuple]]:
    while True:
        rows = cursor.fetchmany(size)
        if not rows:
            return
        yield rows


def copy_tables(plan: MigrationPlan, url: str, *, batch_size: int = BATCH_SIZE,
                on_rows: Callable[[str, int], None] | None = None) -> None:
    """Copy every planned table (after :func:`prepare_target`), ``batch_size`` rows per transaction,
    calling ``on_rows(table, rows)`` after each batch; then move the identity sequences on."""
    conn = _open_source(plan.source)
    try:
        conn.execute("BEGIN")  # one snapshot of the whole source
        with _connect(url) as pg:
            present = _target_tables(pg)
            for table in plan.tables:
                kinds = present[table.name]
                coerce = [_coerce(kinds[c]) for c in table.columns]
                copy_sql = f"COPY {_q(table.name)} ({', '.join(_q(c) for c in table.columns)}) FROM STDIN"
                cursor = conn.execute(_select(conn, table.name, table.columns))
                for batch in _batches(cursor, batch_size):
                    with pg.transaction(), pg.cursor().copy(copy_sql) as copy:
                        for row in batch:
                            copy.write_row([f(v) for f, v in zip(coerce, row, strict=True)])
                    if on_rows:
                        on_rows(table.name, len(batch))
            _advance_sequences(conn, pg, [t.name for t in plan.tables])
        conn.execute("COMMIT")
    finally:
        conn.close()


def _advance_sequences(conn: sqlite3.Connection, pg: Any, tables: list[str]) -> None:
    """Each identity column's sequence past the copied ids and SQLite's AUTOINCREMENT mark."""
    marks: dict[str, int] = {}
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone():
        marks = {name: int(seq or 0) for name, seq in conn.execute("SELECT name, seq FROM sqlite_sequence")}
    identities = pg.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND is_identity = 'YES'").fetchall()
    with pg.transaction():
        for table, column in identities:
            if table not in tables:
                continue
            top = pg.execute(f"SELECT max({_q(column)}) FROM {_q(table)}").fetchone()[0] or 0
            top = max(int(top), marks.get(table, 0))
            sequence = pg.execute("SELECT pg_get_serial_sequence($1, $2)", (_q(table), column)).fetchone()[0]
            if top:
                pg.execute("SELECT setval($1, $2, true)", (sequence, top))
            else:
                pg.execute("SELECT setval($1, 1, false)", (sequence,))


# --- verifying ----------------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z]{5,}")
_CJK_RUN = re.compile("[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]{2,3}")


def sample_queries(source: Path, *, words: int = 5, samples: int = 40) -> list[str]:
    """A few words taken from the source's messages (spread over its history), and one CJK term
    (two or three characters) when a message holds CJK text."""
    conn = _open_source(source)
    try:
        low, high = conn.execute("SELECT min(id), max(id) FROM messages WHERE content IS NOT NULL").fetchone()
        if low is None:
            return []
        found: list[str] = []
        step = max(1, (high - low) // samples)
        for start in range(low, high + 1, step):
            row = conn.execute("SELECT content FROM messages WHERE id >= $1 AND content IS NOT NULL ORDER BY id "
                               "LIMIT 1", (start,)).fetchone()
            candidates = sorted(set(_WORD.findall(row[0] if row else "")), key=lambda w: (-len(w), w))
            for word in candidates[:1]:
                if word.lower() not in (w.lower() for w in found):
                    found.append(word)
        queries = found[: words * 3]  # more than needed: a word too common to compare is passed over
        glob = "*[" + "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES) + "]*"
        row = conn.execute("SELECT content FROM messages WHERE content GLOB $1 ORDER BY id LIMIT 1", (glob,)).fetchone()
        if row and (match := _CJK_RUN.search(row[0])):
            queries.append(match.group(0))
        return queries
    finally:
        conn.close()


def verify_migration(source: Path, url: str, *, words: int = 5) -> Verification:
    """Row counts per copied table on both sides, and the sessions a sample of searches finds on each."""
    from .db import SessionDB

    conn = _open_source(source)
    try:
        names, _ = _source_tables(conn)
        counts = {t: conn.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in _copy_order(conn, names)}
    finally:
        conn.close()
    with _connect(url) as pg:
        present = _target_tables(pg)
        target = {t: pg.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in counts if t in present}
    tables = [TableCheck(t, n, target.get(t, 0)) for t, n in counts.items()]

    searches: list[SearchCheck] = []
    queries = sample_queries(source, words=words)
    with SessionDB(source) as lite, SessionDB(url) as pgdb:
        compared = 0
        for query in queries:
            cjk = bool(_CJK_RUN.fullmatch(query))
            if compared >= words and not cjk:
                continue
            here = lite.search.messages(query, limit=SEARCH_LIMIT)
            if len(here) >= SEARCH_LIMIT:
                continue  # too common: the engines rank differently, so their first pages may differ
            there = pgdb.search.messages(query, limit=SEARCH_LIMIT)
            searches.append(SearchCheck(query, tuple(sorted({h["session_id"] for h in here})),
                                        tuple(sorted({h["session_id"] for h in there}))))
            compared += not cjk
    return Verification(tables=tables, searches=searches)
