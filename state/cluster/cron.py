"""Each scheduled run once across the cluster: the first instance to claim a tick runs it.

    if claim_cron_tick(conn, "digest", scheduled_for=1_763_900_000.0, holder="i-2:4711"):
        ... run the job for that time ...

A tick is a row of ``cron_ticks`` keyed by (job id, scheduled time); the insert
succeeds for exactly one instance, however many race for it.  A one-shot job
at an ISO time is one tick at that time.  Claimed ticks are kept for
:func:`prune_cron_ticks` to remove once they are too old to be claimed again.
"""

from __future__ import annotations

import psycopg

from ._sql import execute

_NOW = "extract(epoch FROM clock_timestamp())"


def claim_cron_tick(conn: psycopg.Connection, job_id: str, scheduled_for: float, holder: str) -> bool:
    """True for the one caller that claims the job's run at ``scheduled_for`` (epoch seconds); False for the rest."""
    row = execute(
        conn,
        f"INSERT INTO cron_ticks (job_id, scheduled_for, holder, claimed_at) VALUES ($1, $2, $3, {_NOW})"
        " ON CONFLICT (job_id, scheduled_for) DO NOTHING RETURNING 1",
        (job_id, float(scheduled_for), holder),
    ).fetchone()
    return row is not None


def cron_tick_holder(conn: psycopg.Connection, job_id: str, scheduled_for: float) -> str | None:
    """Which instance claimed the job's run at ``scheduled_for``, or None when none has."""
    row = execute(
        conn,
        "SELECT holder FROM cron_ticks WHERE job_id = $1 AND scheduled_for = $2", (job_id, float(scheduled_for)),
    ).fetchone()
    return row[0] if row else None


def prune_cron_ticks(conn: psycopg.Connection, older_than: float) -> int:
    """Delete claims of ticks scheduled before ``older_than`` (epoch seconds, past any grace period); how many."""
    return execute(conn, "DELETE FROM cron_ticks WHERE scheduled_for < $1", (float(older_than),)).rowcount
