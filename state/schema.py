"""The schema as a forward-only chain of idempotent migrations.

Version 1 is the earliest shape of the seed design (session storage, seed
001); every later step adds what came after.  A fresh database runs the whole
chain, so the current schema is simply the end of it.  Each step checks
before it changes (a column that exists is not added again), so re-running a
step after a crash half-way through is harmless; all pending steps run inside
one ``BEGIN IMMEDIATE`` transaction together with the version bump.

Later features extend the chain by appending a step from a module in
``state/`` (``register(Migration(12, "pairing", _create_pairing, _create_pairing_pg))``)
before a ``SessionDB`` is opened; versions must follow each other without gaps.

One history, two engines: every step has its SQLite form (``apply``) and its
PostgreSQL form (``apply_pg``), making the same tables and columns.  Most steps are
one definition given as both: its tables are written once with ``state._dialect``'s
type tokens (``{REAL}`` is ``REAL`` on SQLite and ``DOUBLE PRECISION`` on PostgreSQL,
``{INTEGER}`` ``INTEGER``/``BIGINT``, ``{BLOB}`` ``BLOB``/``BYTEA``, ``{ROWID}`` and
``{SERIAL}`` an id the table numbers itself), and the search index is the engine's
(``state.search``).  Only where the SQL truly differs are there two forms (v1: the
seed's FTS triggers, PostgreSQL's scalar ``max``/``min``; v10: a backfill only SQLite
ever needs; v22, v23: the cluster's tables).  A step registered without a PostgreSQL
form still runs on SQLite, but a PostgreSQL store refuses to migrate past it and
``tests/test_state_schema_pg.py`` fails.
On PostgreSQL all pending steps run in one transaction holding an advisory lock
(``state._pg.PgEngine``), so of several instances starting at once one migrates.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from . import _ownership
from ._dialect import dialect_of
from ._sql import NumberedConnection
from .errors import NotADatabase, SchemaTooNew


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[sqlite3.Connection], None]
    #: The same step on PostgreSQL (a ``state._pg_conn.StoreConnection``); None: not written yet.
    apply_pg: Callable[[Any], None] | None = None


MIGRATIONS: list[Migration] = []


def register(step: Migration) -> None:
    """Append a step; its version must be the next one."""
    expected = MIGRATIONS[-1].version + 1 if MIGRATIONS else 1
    if step.version != expected:
        raise ValueError(f"migration {step.name!r} has version {step.version}, expected {expected}")
    MIGRATIONS.append(step)


def current_version() -> int:
    return MIGRATIONS[-1].version


# --- helpers ---------------------------------------------------------------


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return dialect_of(conn).columns(conn, table)


def add_column(conn: sqlite3.Connection, table: str, column: str, decl: str) -> None:
    """Add ``column`` unless it is there; ``decl`` may hold ``state._dialect``'s type tokens."""
    if column not in columns(conn, table):
        conn.execute(f'ALTER TABLE "{table}" ADD COLUMN "{column}" {dialect_of(conn).ddl(decl)}')


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def apply(conn: sqlite3.Connection) -> None:
        # executescript() would COMMIT the migration transaction, so run statement by statement
        pending = ""
        for line in sql.splitlines(keepends=True):
            pending += line
            if sqlite3.complete_statement(pending):
                conn.execute(pending)
                pending = ""
        if pending.strip():
            conn.execute(pending)

    return apply


# --- the chain -------------------------------------------------------------

# v1: the seed's first shape (no title, no billing, no reasoning, no finish_reason)
_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT REFERENCES sessions(id),
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER
);
CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, content=messages, content_rowid=id);
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""

V1_SQL = _V1  # the literal shape, for tests that build an earliest-schema database


def _v2_finish_reason(conn):
    add_column(conn, "messages", "finish_reason", "TEXT")


def _v3_title(conn):
    add_column(conn, "sessions", "title", "TEXT")


def _v4_title_unique(conn):
    conn.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL")


def _v5_billing(conn):
    for name, decl in [
        ("cache_read_tokens", "{INTEGER} DEFAULT 0"),
        ("cache_write_tokens", "{INTEGER} DEFAULT 0"),
        ("reasoning_tokens", "{INTEGER} DEFAULT 0"),
        ("billing_provider", "TEXT"),
        ("billing_base_url", "TEXT"),
        ("billing_mode", "TEXT"),
        ("estimated_cost_usd", "{REAL}"),
        ("actual_cost_usd", "{REAL}"),
        ("cost_status", "TEXT"),
        ("cost_source", "TEXT"),
        ("pricing_version", "TEXT"),
    ]:
        add_column(conn, "sessions", name, decl)


def _v6_reasoning(conn):
    for name in ("reasoning", "reasoning_details", "codex_reasoning_items"):
        add_column(conn, "messages", name, "TEXT")


def _v7_session_key(conn):
    add_column(conn, "sessions", "user_name", "TEXT")
    add_column(conn, "sessions", "session_key", "TEXT")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_session_key ON sessions(session_key)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_user_id ON sessions(user_id)")


def _v8_platform_message_id(conn):
    add_column(conn, "messages", "platform_message_id", "TEXT")
    conn.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_messages_platform_id "
        "ON messages(session_id, platform_message_id) WHERE platform_message_id IS NOT NULL"
    )


def _v9_routes(conn):
    conn.execute(dialect_of(conn).ddl(
        "CREATE TABLE IF NOT EXISTS routes ("
        " session_key TEXT PRIMARY KEY,"
        " session_id TEXT NOT NULL REFERENCES sessions(id),"
        " updated_at {REAL} NOT NULL)"
    ))
    conn.execute("CREATE INDEX IF NOT EXISTS idx_routes_session ON routes(session_id)")


def _v10_listing(conn):
    """Keep preview and last activity on the session row, so listing reads one index."""
    add_column(conn, "sessions", "last_active", "{REAL}")
    add_column(conn, "sessions", "preview", "TEXT")
    conn.execute(
        """UPDATE sessions SET
             last_active = COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = sessions.id),
                                    started_at),
             preview = (SELECT substr(replace(replace(m.content, char(10), ' '), char(13), ' '), 1, 100)
                        FROM messages m
                        WHERE m.session_id = sessions.id AND m.role = 'user' AND m.content IS NOT NULL
                        ORDER BY m.timestamp, m.id LIMIT 1)
           WHERE last_active IS NULL"""
    )
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_source_started ON sessions(source, started_at DESC)")


def _v11_search(conn):
    """Install the engine's search index (``state.search``), on both engines.

    On SQLite, ``state.search.fts5.install`` drops the seed's single FTS table
    and triggers and indexes the existing messages.  When an index changes, it
    appends a step here that calls ``install`` again.
    """
    from .search import search_index  # owned by the search package

    search_index(conn).install(conn)


def _v12_pairing(conn):
    from . import _pairing

    _pairing.create_tables(conn)


def _v13_listing_indexes(conn):
    """Indexes in exactly the listing's order, so the newest 20 are read without a sort."""
    conn.execute("DROP INDEX IF EXISTS idx_sessions_source_started")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_recent ON sessions(started_at DESC, id DESC)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_source_recent ON sessions(source, started_at DESC, id DESC)")


def _v14_cron(conn):
    from . import _cron

    _cron.create_tables(conn)


def _v15_facts(conn):
    from . import _facts

    _facts.create_tables(conn)


def _v16_recovery(conn):
    from . import _recovery

    _recovery.create_tables(conn)


def _v17_listing_by_activity(conn):
    """Listings are ordered by last activity (what they show): indexes on exactly that expression,
    so the newest 20 are read without a sort, as the v13 indexes did for the start time."""
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_active "
                 "ON sessions(COALESCE(last_active, started_at) DESC, id DESC)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_source_active "
                 "ON sessions(source, COALESCE(last_active, started_at) DESC, id DESC)")


def _v18_meta(conn):
    from . import _upkeep

    _upkeep.create_tables(conn)


def _v19_chat_prefs(conn):
    from . import _prefs

    _prefs.create_tables(conn)
    # streamed replies a stop cut short, found at start like the pending ones
    conn.execute("CREATE INDEX IF NOT EXISTS idx_deliveries_streaming ON deliveries(created_at) "
                 "WHERE status = 'streaming'")


def _v20_model_calls(conn):
    from . import _usage

    _usage.create_tables(conn)


def _v21_usage_rollup(conn):
    """Both engines: :func:`state._usage.create_rollup` picks each one's column types."""
    from . import _usage

    _usage.create_rollup(conn)


def _v22_cluster(conn):
    # The cluster's work leases and cron tick claims: used only on PostgreSQL, where several
    # instances share one store; created here too so both backends keep the same tables.
    _script(_CLUSTER_SQLITE)(conn)


_CLUSTER_SQLITE = """
CREATE TABLE IF NOT EXISTS work_leases (
    session_id    TEXT PRIMARY KEY,
    holder        TEXT,
    fencing_token INTEGER NOT NULL DEFAULT 0,
    expires_at    REAL NOT NULL DEFAULT 0,
    pending_seq   INTEGER NOT NULL DEFAULT 0,
    pending_since REAL
);
CREATE TABLE IF NOT EXISTS cron_ticks (
    job_id        TEXT NOT NULL,
    scheduled_for REAL NOT NULL,
    holder        TEXT NOT NULL,
    claimed_at    REAL NOT NULL,
    PRIMARY KEY (job_id, scheduled_for)
);
"""


def _v23_rate_buckets(conn):
    # The cluster's shared rate budgets (state.cluster.budgets): used only on PostgreSQL; created
    # here too so both backends keep the same tables.
    _script(_RATE_BUCKETS_SQLITE)(conn)


_RATE_BUCKETS_SQLITE = """
CREATE TABLE IF NOT EXISTS rate_buckets (
    key          TEXT PRIMARY KEY,
    tat          REAL NOT NULL,
    last_slot    REAL NOT NULL,
    paused_until REAL NOT NULL DEFAULT 0
);
"""


# v24: a message's place in its session (``state._messages.ORDER_KEY``): NULL keeps the place of its
# arrival, so existing rows need no backfill (their sessions now read in arrival order, not by
# timestamp: the same but where a clock stepped back).  The same two statements on both engines.
_V24_ORDER = (
    "ALTER TABLE messages ADD COLUMN pos BIGINT",
    "CREATE INDEX IF NOT EXISTS idx_messages_order ON messages(session_id, (COALESCE(pos, id * 1048576)))",
)


def _v24_order(conn):
    if "pos" not in columns(conn, "messages"):
        conn.execute(_V24_ORDER[0])
    conn.execute(_V24_ORDER[1])


def _v25_tool_calls(conn):
    """Both engines: :mod:`state._toolcalls` (the journal of calls in flight, ``cron_jobs.tools``)."""
    from . import _toolcalls

    _toolcalls.create_tables(conn)


def _v26_budgets(conn):
    """Both engines: :data:`state._budgets.TABLES`."""
    from . import _budgets

    _budgets.create_tables(conn)


def _v31_budget_reservations(conn):
    """Both engines: :data:`state._budgets.TABLES_V31` (the reservations of admitted calls, the resets)."""
    from . import _budgets

    _budgets.create_v31(conn)


def _v27_tool_approvals(conn):
    """Both engines: :data:`state._approvals.TABLES` (tool calls waiting for approval, and their answers)."""
    from . import _approvals

    _approvals.create_tables(conn)


def _v28_media(conn):
    """Both engines: :data:`state._media.TABLES`."""
    from . import _media

    _media.create_tables(conn)


def _v29_trace_id(conn):
    """Both engines: ``messages.trace_id``, the trace (32 hex digits) of the turn that wrote a reply or
    tool message, when traces were on and the trace was sampled; NULL otherwise (and for older rows)."""
    add_column(conn, "messages", "trace_id", "TEXT")


def _v30_media_search(conn):
    """Both engines: the documents' search index over ``message_media.text`` (``state.search``)."""
    from .search import search_index  # owned by the search package

    search_index(conn).install_media(conn)


def _v32_pairing_waiting(conn):
    """Both engines: the message a stranger sent before being approved (``pairing_requests.waiting``,
    JSON), moved to ``approved_users.waiting`` on approval until the daemon has greeted the user and
    answered it; NULL otherwise."""
    add_column(conn, "pairing_requests", "waiting", "TEXT")
    add_column(conn, "approved_users", "waiting", "TEXT")


def _v33_tool_questions(conn):
    """Both engines: :data:`state._questions.TABLES` (what MCP servers asked users mid-call)."""
    from . import _questions

    _questions.create_tables(conn)


def _v34_a2a_tasks(conn):
    """Both engines: :data:`state._a2a.TABLES` (the A2A endpoint's tasks, kept across restarts)."""
    from . import _a2a

    _a2a.create_tables(conn)


def _v35_signatures_seen(conn):
    """Both engines: :data:`state._replays.TABLES` (signed requests accepted: a replay is refused by
    every instance on the store)."""
    from . import _replays

    _replays.create_tables(conn)
def _v37_mcp_auth(conn):
    """Both engines: :data:`state._mcp_auth.TABLES` (the MCP servers' OAuth tokens, sealed, and sign-ins
    under way)."""
    from . import _mcp_auth

    _mcp_auth.create_tables(conn)


def _v38_resumable_questions(conn):
    """Both engines: a question's call can be sent again after a restart (:data:`state._questions.RESUME_COLUMNS`)."""
    from . import _questions

    _questions.add_resume_columns(conn)


def _v39_signature_holds(conn):
    """Both engines: ``signatures_seen.held_until`` (a claim whose request is not stored yet)."""
    from . import _replays

    _replays.add_held_column(conn)


def _v36_delivery_receipts(conn):
    """Both engines: :data:`state._receipts.TABLES` (what a platform reported of the messages we sent)."""
    from . import _receipts

    _receipts.create_tables(conn)


# --- the PostgreSQL forms -----------------------------------------------------


def _pg(*statements: str) -> Callable[[Any], None]:
    def apply(conn: Any) -> None:
        for sql in statements:
            conn.execute(sql)

    return apply


# v1 on PostgreSQL also defines SQLite's scalar max() and min() of two or three numbers, so the store's
# SQL (``MAX(started_at, last_active, ended_at)``, ``min(1.0, trust + $1)``) reads the same on both engines.
_V1_PG = (
    """CREATE TABLE IF NOT EXISTS sessions (
        id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        user_id TEXT,
        model TEXT,
        model_config TEXT,
        system_prompt TEXT,
        parent_session_id TEXT REFERENCES sessions(id),
        started_at DOUBLE PRECISION NOT NULL,
        ended_at DOUBLE PRECISION,
        end_reason TEXT,
        message_count BIGINT DEFAULT 0,
        tool_call_count BIGINT DEFAULT 0,
        input_tokens BIGINT DEFAULT 0,
        output_tokens BIGINT DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS messages (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        role TEXT NOT NULL,
        content TEXT,
        tool_call_id TEXT,
        tool_calls TEXT,
        tool_name TEXT,
        timestamp DOUBLE PRECISION NOT NULL,
        token_count BIGINT)""",
    "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)",
    "CREATE OR REPLACE FUNCTION max(a DOUBLE PRECISION, b DOUBLE PRECISION) RETURNS DOUBLE PRECISION "
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT GREATEST(a, b)'",
    "CREATE OR REPLACE FUNCTION max(a DOUBLE PRECISION, b DOUBLE PRECISION, c DOUBLE PRECISION) "
    "RETURNS DOUBLE PRECISION LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT GREATEST(a, b, c)'",
    "CREATE OR REPLACE FUNCTION min(a DOUBLE PRECISION, b DOUBLE PRECISION) RETURNS DOUBLE PRECISION "
    "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT LEAST(a, b)'",
)


def _v10_listing_pg(conn):
    # No backfill: a PostgreSQL store starts at the newest schema (its first release had v20), so
    # this step only ever runs on empty tables.
    add_column(conn, "sessions", "last_active", "{REAL}")
    add_column(conn, "sessions", "preview", "TEXT")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_sessions_source_started ON sessions(source, started_at DESC)")


def _v22_cluster_pg(conn):
    from .cluster.ddl import CLUSTER_TABLES_PG

    _pg(*filter(str.strip, CLUSTER_TABLES_PG.split(";")))(conn)


def _v23_rate_buckets_pg(conn):
    from .cluster.ddl import RATE_BUCKETS_PG

    _pg(*filter(str.strip, RATE_BUCKETS_PG.split(";")))(conn)


for _step in [
    Migration(1, "seed initial schema", _script(_V1), _pg(*_V1_PG)),
    Migration(2, "messages.finish_reason", _v2_finish_reason, _v2_finish_reason),
    Migration(3, "sessions.title", _v3_title, _v3_title),
    Migration(4, "unique titles", _v4_title_unique, _v4_title_unique),
    Migration(5, "billing columns", _v5_billing, _v5_billing),
    Migration(6, "reasoning columns", _v6_reasoning, _v6_reasoning),
    Migration(7, "sessions.session_key, user_name", _v7_session_key, _v7_session_key),
    Migration(8, "messages.platform_message_id", _v8_platform_message_id, _v8_platform_message_id),
    Migration(9, "routes", _v9_routes, _v9_routes),
    Migration(10, "listing columns", _v10_listing, _v10_listing_pg),
    Migration(11, "search indexes", _v11_search, _v11_search),
    Migration(12, "pairing requests and approved users", _v12_pairing, _v12_pairing),
    Migration(13, "listing indexes", _v13_listing_indexes, _v13_listing_indexes),
    Migration(14, "cron jobs, runs and leases", _v14_cron, _v14_cron),
    Migration(15, "facts, their FTS index, extraction claims, prefetch switches", _v15_facts, _v15_facts),
    Migration(16, "inbox of unanswered messages, delivery record, dead letters", _v16_recovery, _v16_recovery),
    Migration(17, "listing indexes by last activity", _v17_listing_by_activity, _v17_listing_by_activity),
    Migration(18, "meta: the last upkeep", _v18_meta, _v18_meta),
    Migration(19, "per-chat choices (/stream on|off), streamed replies' index", _v19_chat_prefs, _v19_chat_prefs),
    Migration(20, "the usage ledger: one row per model call", _v20_model_calls, _v20_model_calls),
    Migration(21, "the usage ledger's daily roll-up, for reports", _v21_usage_rollup, _v21_usage_rollup),
    Migration(22, "cluster: work leases and cron tick claims", _v22_cluster, _v22_cluster_pg),
    Migration(23, "cluster: shared rate budgets", _v23_rate_buckets, _v23_rate_buckets_pg),
    Migration(24, "messages.pos: a reply placed right after what it answers", _v24_order, _v24_order),
    Migration(25, "tool calls: the journal of calls in flight, cron_jobs.tools", _v25_tool_calls, _v25_tool_calls),
    Migration(26, "budgets: spend per scope and period, rules set from the CLI, notices sent", _v26_budgets,
              _v26_budgets),
    Migration(27, "tool calls waiting for approval, and their answers", _v27_tool_approvals, _v27_tool_approvals),
    Migration(28, "message_media: a message's files by hash (the bytes in the media folder)", _v28_media, _v28_media),
    Migration(29, "messages.trace_id: the trace of the turn that wrote it", _v29_trace_id, _v29_trace_id),
    Migration(30, "search over the text of messages' files (documents, descriptions, transcripts)",
              _v30_media_search, _v30_media_search),
    Migration(31, "budgets: reservations of admitted calls (shared across instances), resets",
              _v31_budget_reservations, _v31_budget_reservations),
    Migration(32, "pairing: the message that waits for the approval", _v32_pairing_waiting, _v32_pairing_waiting),
    Migration(33, "questions MCP servers asked users mid-call (elicitation), and the answers", _v33_tool_questions,
              _v33_tool_questions),
    Migration(34, "A2A tasks: what other agents asked, their states, their push notifications", _v34_a2a_tasks,
              _v34_a2a_tasks),
    Migration(35, "signatures of signed webhook requests accepted, for a replay guard shared by instances",
              _v35_signatures_seen, _v35_signatures_seen),
    Migration(36, "delivery receipts: sent, delivered, read or failed, as the platform reported each message we sent",
              _v36_delivery_receipts, _v36_delivery_receipts),
    Migration(37, "OAuth sign-ins to remote MCP servers: tokens and registrations (sealed), flows under way",
              _v37_mcp_auth, _v37_mcp_auth),
    Migration(38, "questions of a call that is sent again with the answers, after a restart too",
              _v38_resumable_questions, _v38_resumable_questions),
    Migration(39, "a webhook signature is held until its request is stored, so a resend after a crash is taken",
              _v39_signature_holds, _v39_signature_holds),
]:
    register(_step)


# --- running it ------------------------------------------------------------


@lru_cache(maxsize=1)
def _core_columns_by_version() -> dict[int, dict[str, frozenset[str]]]:
    """The columns of ``sessions`` and ``messages`` after each step of the chain (built once, in memory)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, factory=NumberedConnection)  # the steps' SQL: $n
    try:
        conn.execute("BEGIN")
        shapes: dict[int, dict[str, frozenset[str]]] = {}
        for step in MIGRATIONS:
            step.apply(conn)
            shapes[step.version] = {t: frozenset(columns(conn, t)) for t in _ownership.CORE_TABLES}
        conn.execute("ROLLBACK")
        return shapes
    finally:
        conn.close()


def core_columns(version: int) -> dict[str, frozenset[str]] | None:
    """The columns ``sessions`` and ``messages`` have in a store of ours at ``version`` (None: not a
    version of ours), by which ``state._ownership`` knows a store written before stores were marked."""
    return _core_columns_by_version().get(version)


def read_version(conn: sqlite3.Connection, path: str) -> int:
    """The stored version; 0 for an empty file.  Refuses what is not ours (``state._ownership``).

    Only reads: never takes the write lock.
    """
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_version" in tables:
            foreign = _ownership.foreign_reason(conn, core_columns)  # Hermes Agent's state.db has one too
            if foreign is not None:
                raise NotADatabase(path, foreign)
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0] or 0)
        elif not tables:
            version = 0
        else:
            raise NotADatabase(path, "a SQLite database, but not a Switchboard state store (no schema_version table)")
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise
        raise NotADatabase(path) from exc
    if version > current_version():
        raise SchemaTooNew(path, version, current_version())
    return version


def migrate(conn: sqlite3.Connection, from_version: int) -> int:
    """Apply every step after ``from_version``; the caller holds ``BEGIN IMMEDIATE``."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    for step in MIGRATIONS:
        if step.version > from_version:
            step.apply(conn)
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES ($1)", (current_version(),))
    conn.execute(f"PRAGMA application_id = {_ownership.APPLICATION_ID}")  # the file says whose it is
    return current_version()


# --- running it on PostgreSQL ------------------------------------------------------------------


def read_version_pg(conn: Any, where: str) -> int:
    """The stored version on PostgreSQL; 0 for a database without tables in its schema.  Refuses
    a database whose schema holds other tables (not ours) or a newer version."""
    if conn.execute("SELECT to_regclass('schema_version')").fetchone()[0] is not None:
        version = int(conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
    elif conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() "
                      "LIMIT 1").fetchone():
        raise NotADatabase(where, "a PostgreSQL database whose schema holds tables, but not a Switchboard state "
                                  "store (no schema_version table); point store.url at an empty database")
    else:
        version = 0
    if version > current_version():
        raise SchemaTooNew(where, version, current_version())
    return version


def missing_pg_forms() -> list[Migration]:
    """Registered steps without a PostgreSQL form (each must have one)."""
    return [step for step in MIGRATIONS if step.apply_pg is None]


def migrate_pg(conn: Any, from_version: int) -> int:
    """Apply every step after ``from_version`` on PostgreSQL; the caller holds the migration lock."""
    missing = [step for step in missing_pg_forms() if step.version > from_version]
    if missing:
        names = ", ".join(f"v{step.version} ({step.name})" for step in missing)
        raise RuntimeError(f"schema steps without a PostgreSQL form: {names}; this Switchboard cannot use "
                           "a PostgreSQL store until they are written")
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
    for step in MIGRATIONS:
        if step.version > from_version:
            assert step.apply_pg is not None
            step.apply_pg(conn)
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES ($1)", (current_version(),))
    return current_version()
