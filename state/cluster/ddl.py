"""The cluster tables, in their PostgreSQL form.

The lead folds :data:`CLUSTER_TABLES_PG` into the numbered migration chain
(``state/schema.py``) as one step's PostgreSQL form; until then
:func:`create_cluster_tables` creates them (idempotent, safe when several
instances call it at once).  SQLite needs no form: one instance on one file
coordinates with itself.

    work_lease_tokens  the sequence fencing tokens come from: every claim takes
                       a new value, so tokens rise across every session and holder
    work_leases        one row per session that ever had work: who runs its turn
                       (``holder``) until ``expires_at``, under ``fencing_token``,
                       and whether inbound work waits (``pending_since``, with
                       ``pending_seq`` counting every arrival)
    cron_ticks         one row per (job, scheduled time) that some instance ran:
                       the primary key lets exactly one instance claim a tick
    rate_buckets       (schema v23, :data:`RATE_BUCKETS_PG`) one row per shared rate
                       budget (a bot token's, a chat's): see :mod:`state.cluster.budgets`

Times are seconds since the epoch (``double precision``), as in the SQLite
store, read from the database server's clock (``clock_timestamp()``) so the
instances' own clocks never matter.
"""

from __future__ import annotations

import psycopg

from ._sql import execute

CLUSTER_TABLES_PG = """
CREATE SEQUENCE IF NOT EXISTS work_lease_tokens;
CREATE TABLE IF NOT EXISTS work_leases (
    session_id    TEXT PRIMARY KEY,
    holder        TEXT,
    fencing_token BIGINT NOT NULL DEFAULT 0,
    expires_at    DOUBLE PRECISION NOT NULL DEFAULT 0,
    pending_seq   BIGINT NOT NULL DEFAULT 0,
    pending_since DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS idx_work_leases_pending ON work_leases (pending_since) WHERE pending_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS cron_ticks (
    job_id        TEXT NOT NULL,
    scheduled_for DOUBLE PRECISION NOT NULL,
    holder        TEXT NOT NULL,
    claimed_at    DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, scheduled_for)
);
"""

RATE_BUCKETS_PG = """
CREATE TABLE IF NOT EXISTS rate_buckets (
    key          TEXT PRIMARY KEY,
    tat          DOUBLE PRECISION NOT NULL,
    last_slot    DOUBLE PRECISION NOT NULL,
    paused_until DOUBLE PRECISION NOT NULL DEFAULT 0
);
"""

# Any fixed number: instances creating the tables at once take turns on it.
_CREATE_LOCK = 0x5377_6263_4C75_7374  # "SwbcLust"


def create_cluster_tables(conn: psycopg.Connection) -> None:
    """Create the cluster tables if missing, in one transaction, one instance at a time."""
    with conn.transaction():
        execute(conn, "SELECT pg_advisory_xact_lock($1)", (_CREATE_LOCK,))
        for statement in filter(str.strip, (CLUSTER_TABLES_PG + RATE_BUCKETS_PG).split(";")):
            conn.execute(statement)  # our own constant, never user input
