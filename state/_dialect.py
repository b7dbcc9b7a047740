"""What truly differs between the store's two engines, in one object per engine.

The feature modules (``_usage``, ``_upkeep``, ``_transfer``, ``db``, ...) write their SQL once and ask
:func:`dialect_of` for the few parts that differ; they never ask which engine they run on.

    SQLITE     sqlite3 (a file, one writer process at a time)
    POSTGRES   psycopg, through ``state._pg_conn.StoreConnection`` (one server, any number of instances)

What a :class:`Dialect` carries:

* ``search``: the name of the engine's full-text index (``state.search``);
* type names: ``integer``, ``real``, ``blob``, ``rowid`` and ``serial`` (an id the table numbers itself;
  ``serial`` never reuses one), and ``without_rowid`` (the clause a keyed table takes); :meth:`~Dialect.ddl`
  writes them into a table's one definition, whose type tokens are ``{INTEGER}``, ``{REAL}``,
  ``{BLOB}``, ``{ROWID}``, ``{SERIAL}`` and ``{WITHOUT_ROWID}``;
* :meth:`~Dialect.json_values`: a subquery over a JSON array bound as one parameter;
* :meth:`~Dialect.byte_length`, :meth:`~Dialect.day` and :meth:`~Dialect.month`: a text's size in bytes, a
  time's UTC day and UTC month;
* :meth:`~Dialect.insert_rows` and :meth:`~Dialect.insert_ids`: many rows inserted in as few statements as the
  engine gains from (with an upsert's tail; with the new rows' ids);
* :meth:`~Dialect.is_integrity_error`: a constraint failed;
* :meth:`~Dialect.columns`, :meth:`~Dialect.store_size`, :meth:`~Dialect.database_bytes`,
  :meth:`~Dialect.object_sizes`: the catalogue and the sizes, which each engine keeps its own way;
* :meth:`~Dialect.ids_restored`: after rows were inserted with the ids they had elsewhere;
* :meth:`~Dialect.mark_pending`, :meth:`~Dialect.fence` and :meth:`~Dialect.give_back`: the cluster's leases
  (only PostgreSQL has them).

Upserts (``ON CONFLICT ... DO UPDATE SET x = excluded.x``) and ``RETURNING`` of one row are written
the same on both engines, so they need no entry here.  Nearly a leaf: of the store it imports only
``state._sql`` (a leaf) at module level, so every module may ask it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ._sql import numbered


@dataclass(frozen=True, slots=True)
class StoreSize:
    db_bytes: int
    wal_bytes: int
    page_size: int
    free_pages: int
    auto_vacuum: str  # none | full | incremental (SQLite); postgresql

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_size


def file_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


#: The first key of :meth:`Dialect.serialize`'s advisory locks on PostgreSQL, one per kind of thing.
ADVISORY_CLASSES = {"titles": 0x5357_0001, "session": 0x5357_0002, "pairing": 0x5357_0003,
                    "cron": 0x5357_0004, "dead_letter": 0x5357_0005}


class Dialect:
    """The parts of SQL and of the catalogue that differ between the engines (see the module docstring)."""

    name: str
    #: Which ``state.search`` index the engine keeps: ``fts5`` or ``tsvector``.
    search: str
    integer: str
    real: str
    blob: str
    rowid: str
    serial: str
    without_rowid: str

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"

    def ddl(self, sql: str) -> str:
        """A statement written once with type tokens (see the module docstring), in this engine's names."""
        for token, name in (("{INTEGER}", self.integer), ("{REAL}", self.real), ("{BLOB}", self.blob),
                            ("{ROWID}", self.rowid), ("{SERIAL}", self.serial), ("{WITHOUT_ROWID}", self.without_rowid)):
            sql = sql.replace(token, name)
        return sql

    def create(self, conn: Any, statements: Sequence[str]) -> None:
        """Run each of ``statements`` (tables and indexes written once, with type tokens) in this engine's names."""
        for sql in statements:
            conn.execute(self.ddl(sql))

    def json_values(self, param: str, *, integers: bool = False) -> str:
        """A subquery yielding, as its column ``value``, the elements of a JSON array passed as the one
        parameter ``param`` (``$n``; ``IN (...)`` over many ids without one parameter each); ``integers``:
        as ids."""
        raise NotImplementedError

    def byte_length(self, expr: str) -> str:
        """The size in bytes of the text ``expr`` (NULL counting as empty)."""
        raise NotImplementedError

    def day(self, seconds: str) -> str:
        """The UTC day number (days since 1970) of the epoch seconds ``seconds``, as an integer."""
        raise NotImplementedError

    def month(self, seconds: str) -> str:
        """The UTC month (``YYYY-MM``) of the epoch seconds ``seconds``, as text."""
        raise NotImplementedError

    def object_sizes(self, conn: Any) -> tuple[list[tuple[str, str, str, int | None]], str | None]:
        """(name, ``table`` or ``index``, the table it belongs to, bytes or None when unknown) of every table
        and index, and a note when the engine cannot measure them one by one."""
        raise NotImplementedError

    def insert_rows(self, conn: Any, head: str, tail: str, rows: Sequence[Sequence[Any]]) -> None:
        """``head VALUES (...) tail`` for each of ``rows`` (``head``: ``INSERT INTO t (columns)``; ``tail``:
        an ``ON CONFLICT`` clause or empty).  An upsert's rows must have distinct keys (a statement may
        change a row once), and lock their rows in the order given."""
        raise NotImplementedError

    def insert_ids(self, conn: Any, head: str, rows: Sequence[Sequence[Any]]) -> list[int]:
        """``head VALUES (...)`` (``head``: ``INSERT INTO t (columns)``) for each of ``rows``; the new rows'
        ids in order."""
        raise NotImplementedError

    def is_integrity_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a constraint failed (unique, foreign key, not null)."""
        return is_integrity_error(exc)

    def columns(self, conn: Any, table: str) -> set[str]:
        """The names of ``table``'s columns (none when it does not exist)."""
        raise NotImplementedError

    def database_bytes(self, conn: Any, path: Path | str | None) -> tuple[int, int]:
        """(the database's size, its write-ahead log's size) in bytes; ``path`` is SQLite's file."""
        raise NotImplementedError

    def store_size(self, conn: Any, path: Path | None) -> StoreSize:
        """The sizes, and the free pages there are to give back (upkeep's vacuum)."""
        raise NotImplementedError

    def ids_restored(self, conn: Any, table: str) -> None:
        """Rows of ``table`` were inserted with the ids they had elsewhere: a new row's id must come after them."""

    def mark_pending(self, conn: Any, session_id: str) -> bool:
        """A session has an inbound message waiting: whichever instance may take it, should (cluster).
        Whether it was marked: SQLite has one instance, which answers everything itself."""
        return False

    def fence(self, conn: Any, session_id: str, token: int) -> None:
        """First in a fenced write: raise ``LeaseLost`` (nothing written) unless the lease's ``token`` still
        holds.  SQLite has one instance per file and no leases: nothing to guard against."""

    def give_back(self, conn: Any, session_id: str, token: int, seen: int) -> bool:
        """In the transaction that marks a turn's reply sent: the lease ``token`` given back, its work finished
        unless more arrived since ``seen`` (cluster); whether it was still held.  SQLite has no leases."""
        return False

    #: Appended to a ``SELECT`` of one table in a write that goes on to change what it read: the rows
    #: found are locked until the transaction ends (PostgreSQL's writes run at ``READ COMMITTED``), and a
    #: row another transaction changed is read as it committed.  Empty on SQLite, where ``BEGIN
    #: IMMEDIATE`` already makes every write wait for the one before it.
    for_update = ""
    #: Appended to a ``SELECT`` that checks a row exists before a write refers to it (a session a route
    #: or a child will point at): it cannot be deleted before this transaction ends.  Empty on SQLite.
    for_key_share = ""

    def serialize(self, conn: Any, what: str, key: str = "") -> None:
        """Make the writes that call this with the same ``what`` and ``key`` take turns, until this
        transaction ends: for a read-then-write whose rows may not exist yet (a new session's id, a title
        that must stay unique).  A transaction-level advisory lock on PostgreSQL; nothing on SQLite."""


class _Sqlite(Dialect):
    """SQLite: one instance per file (no leases), ids from the rowid this transaction alone hands out."""

    name = "sqlite"
    search = "fts5"
    integer, real, blob, without_rowid = "INTEGER", "REAL", "BLOB", " WITHOUT ROWID"
    rowid, serial = "INTEGER PRIMARY KEY", "INTEGER PRIMARY KEY AUTOINCREMENT"

    def json_values(self, param: str, *, integers: bool = False) -> str:
        return f"SELECT value FROM json_each({param})"

    def byte_length(self, expr: str) -> str:
        return f"length(CAST(ifnull({expr}, '') AS BLOB))"

    def day(self, seconds: str) -> str:
        return f"CAST({seconds} / 86400 AS INTEGER)"  # CAST truncates

    def month(self, seconds: str) -> str:
        return f"strftime('%Y-%m', {seconds}, 'unixepoch')"

    def object_sizes(self, conn: Any) -> tuple[list[tuple[str, str, str, int | None]], str | None]:
        import sqlite3

        catalogue = {row[0]: (row[1], row[2]) for row in conn.execute(
            "SELECT name, type, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')")}
        catalogue.setdefault("sqlite_schema", ("table", "sqlite_schema"))
        try:  # one row per b-tree (aggregate: without reading each page's row)
            sizes = {row[0]: int(row[1]) for row in conn.execute(
                "SELECT name, pgsize FROM dbstat WHERE aggregate = 1")}
        except sqlite3.OperationalError:  # a build without SQLITE_ENABLE_DBSTAT_VTAB
            return ([(name, kind, table, None) for name, (kind, table) in catalogue.items()],
                    "this SQLite build has no dbstat table: the size of each table and index is unknown "
                    "(the file's size, WAL and free pages below are exact)")
        sizes["sqlite_schema"] = sizes.pop("sqlite_master", sizes.get("sqlite_schema", 0))
        return [(name, *catalogue.get(name, ("table", name)), size) for name, size in sizes.items()], None

    # No round trips to save: the one-row statement, prepared once, for each row.  (A multi-row VALUES
    # list would cost more: SQLite looks each $n up among the names before it as it prepares.)
    def insert_rows(self, conn: Any, head: str, tail: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            conn.executemany(f"{head} VALUES ({numbered(len(rows[0]))}) {tail}", rows)

    def insert_ids(self, conn: Any, head: str, rows: Sequence[Sequence[Any]]) -> list[int]:
        if not rows:
            return []
        sql = f"{head} VALUES ({numbered(len(rows[0]))})"
        first = int(conn.execute(sql, rows[0]).lastrowid or 0)
        conn.executemany(sql, rows[1:])  # each the next rowid: this transaction holds the write lock
        return list(range(first, first + len(rows)))

    def columns(self, conn: Any, table: str) -> set[str]:
        return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}

    def database_bytes(self, conn: Any, path: Path | str | None) -> tuple[int, int]:
        if path is None:
            return 0, 0
        path = Path(path)
        return file_size(path), file_size(path.with_name(path.name + "-wal"))

    def store_size(self, conn: Any, path: Path | None) -> StoreSize:
        assert path is not None
        mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
        db_bytes, wal_bytes = self.database_bytes(conn, path)
        return StoreSize(
            db_bytes=db_bytes,
            wal_bytes=wal_bytes,
            page_size=conn.execute("PRAGMA page_size").fetchone()[0],
            free_pages=conn.execute("PRAGMA freelist_count").fetchone()[0],
            auto_vacuum={0: "none", 1: "full", 2: "incremental"}.get(mode, str(mode)),
        )


class _Postgres(Dialect):
    """PostgreSQL: ids from sequences other instances share, leases for the cluster, no WAL of ours."""

    name = "postgresql"
    search = "tsvector"
    integer, real, blob, without_rowid = "BIGINT", "DOUBLE PRECISION", "BYTEA", ""
    rowid = serial = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"

    def json_values(self, param: str, *, integers: bool = False) -> str:
        if integers:
            return f"SELECT CAST(jsonb_array_elements_text(CAST({param} AS jsonb)) AS BIGINT) AS value"
        return f"SELECT jsonb_array_elements_text(CAST({param} AS jsonb)) AS value"

    def byte_length(self, expr: str) -> str:
        return f"octet_length(COALESCE({expr}, ''))"

    def day(self, seconds: str) -> str:
        return f"CAST(floor({seconds} / 86400) AS BIGINT)"  # CAST rounds: floor first

    def month(self, seconds: str) -> str:
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM')"

    def object_sizes(self, conn: Any) -> tuple[list[tuple[str, str, str, int | None]], str | None]:
        # a table's bytes: its heap and TOAST (long texts), without its indexes, which have rows of their own
        rows = conn.execute(
            "SELECT c.relname, 'table', c.relname, pg_total_relation_size(c.oid) - pg_indexes_size(c.oid) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'm') "
            "UNION ALL "
            "SELECT i.relname, 'index', t.relname, pg_relation_size(i.oid) "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = current_schema()").fetchall()
        return [(r[0], r[1], r[2], int(r[3])) for r in rows], None

    # One multi-row statement (one round trip) per ROWS_PER_STATEMENT rows.
    def insert_rows(self, conn: Any, head: str, tail: str, rows: Sequence[Sequence[Any]]) -> None:
        for values, chunk in _multi_row(rows):
            conn.execute(f"{head} VALUES {values} {tail}", chunk)

    def insert_ids(self, conn: Any, head: str, rows: Sequence[Sequence[Any]]) -> list[int]:
        # each row's id from the sequence other instances share.  RETURNING's order is not promised, but
        # the sequence is drawn as the VALUES list is read, one row after the other: the ids in ascending
        # order are the rows' in order.
        ids: list[int] = []
        for values, chunk in _multi_row(rows):
            ids += sorted(int(row[0]) for row in conn.execute(f"{head} VALUES {values} RETURNING id", chunk))
        return ids

    def columns(self, conn: Any, table: str) -> set[str]:
        return {row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = $1", (table,))}

    def database_bytes(self, conn: Any, path: Path | str | None) -> tuple[int, int]:
        return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0], 0

    def store_size(self, conn: Any, path: Path | None) -> StoreSize:
        # its own autovacuum reuses free space: nothing for upkeep to vacuum, no WAL of ours
        size = conn.execute("SELECT pg_database_size(current_database()), current_setting('block_size')").fetchone()
        return StoreSize(db_bytes=size[0], wal_bytes=0, page_size=int(size[1]), free_pages=0, auto_vacuum="postgresql")

    def ids_restored(self, conn: Any, table: str) -> None:
        conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), GREATEST((SELECT max(id) FROM {table}), 1))")

    for_update = " FOR UPDATE"
    for_key_share = " FOR KEY SHARE"

    def serialize(self, conn: Any, what: str, key: str = "") -> None:
        # the two-int form: its keys never meet the single-bigint ones (the migration's, the cluster's)
        conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", (ADVISORY_CLASSES[what], key))

    def mark_pending(self, conn: Any, session_id: str) -> bool:
        from .cluster.leases import mark_pending

        mark_pending(conn, session_id)
        return True

    def fence(self, conn: Any, session_id: str, token: int) -> None:
        from .cluster.leases import fenced_write

        fenced_write(conn, session_id, token)

    def give_back(self, conn: Any, session_id: str, token: int, seen: int) -> bool:
        from .cluster.leases import release_token

        return release_token(conn, session_id, token, seen, finished=True)


SQLITE: Dialect = _Sqlite()
POSTGRES: Dialect = _Postgres()


#: Rows one multi-row statement on PostgreSQL takes at most.
ROWS_PER_STATEMENT = 200


def _multi_row(rows: Sequence[Sequence[Any]]) -> Iterator[tuple[str, list[Any]]]:
    """``($1, ...), ($k, ...)`` and its values, for every :data:`ROWS_PER_STATEMENT` of ``rows``."""
    width = len(rows[0]) if rows else 0
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[i:i + ROWS_PER_STATEMENT]
        yield (", ".join([f"({numbered(width, 1 + k * width)})" for k in range(len(chunk))]),
               [v for row in chunk for v in row])


def dialect_of(conn: Any) -> Dialect:
    """The dialect a store function's connection speaks: a ``state._pg_conn.StoreConnection`` carries POSTGRES,
    anything else is sqlite3."""
    return getattr(conn, "dialect", SQLITE)


def is_integrity_error(exc: BaseException) -> bool:
    """A constraint failed (unique, foreign key, not null), on either engine."""
    import sqlite3

    if isinstance(exc, sqlite3.IntegrityError):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.IntegrityError)

