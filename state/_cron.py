"""Scheduled jobs: their definitions, every run, and the leases that keep one run of a job at a time.

    cron_jobs     one row per job (from the config or the CLI); ``next_run_at`` is
                  the truth for "what is due", so runs missed while no daemon was
                  running are found after a restart
    cron_runs     every run: scheduled time, start, end, status, session, error,
                  the answer and where its delivery stands (an outbox the daemon
                  works through, retrying failed deliveries)
    cron_leases   job_id -> holder until expires_at; taken in the same write
                  transaction that records the run, so two processes never run
                  one job at once

Run status: ``running`` -> ``ok`` | ``error`` | ``delivery_failed`` |
``skipped``, with ``delivering`` for an answer waiting for its first
delivery attempt.  Delivery: ``pending`` (to be tried at
``next_delivery_at``), ``delivered``, ``failed`` (gave up), ``silent``
(the answer was ``[SILENT]``), ``local`` (kept here only).

Times are passed in by the caller (the gateway's clock), never read here.

**Locks (PostgreSQL, writes at READ COMMITTED).**  Every write of this module reads what it then
changes (whether a lease is held, a run still running, a job still there), so each takes the one
``cron`` advisory lock first (:func:`_in_turn`): cron's writes take turns, as all writes do on SQLite.
They come a few a minute, so the turns cost nothing; the cluster's tick claims (``state.cluster.cron``)
settle their own race with ``ON CONFLICT``.
"""

from __future__ import annotations

import sqlite3
from typing import Any, overload

from . import _sessions
from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered
from .errors import CronJobExists, CronJobNotFound

JOB_FIELDS = ("id", "name", "schedule", "prompt", "deliver", "model", "context", "grace_seconds", "source",
              "paused", "created_at", "updated_at", "next_run_at", "last_run_at", "tools")
RUN_FIELDS = ("id", "job_id", "trigger", "scheduled_at", "started_at", "ended_at", "status", "session_id",
              "output", "error", "note", "deliver", "delivery", "delivery_attempts", "next_delivery_at",
              "delivered_at", "delivery_error", "holder")
EDITABLE = ("name", "schedule", "prompt", "deliver", "model", "context", "grace_seconds", "tools")
KEEP_RUNS = 1000  # runs kept per job; older ones are deleted as new ones finish


#: The tables (schema v14), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    "CREATE TABLE IF NOT EXISTS cron_jobs ("
    " id TEXT PRIMARY KEY, name TEXT NOT NULL, schedule TEXT NOT NULL, prompt TEXT NOT NULL,"
    " deliver TEXT NOT NULL DEFAULT 'local', model TEXT, context TEXT NOT NULL DEFAULT 'fresh',"
    " grace_seconds {REAL} NOT NULL DEFAULT 3600, source TEXT NOT NULL, paused {INTEGER} NOT NULL DEFAULT 0,"
    " created_at {REAL} NOT NULL, updated_at {REAL} NOT NULL, next_run_at {REAL}, last_run_at {REAL})",
    "CREATE TABLE IF NOT EXISTS cron_runs ("
    " id {SERIAL}, job_id TEXT NOT NULL, trigger TEXT NOT NULL,"
    " scheduled_at {REAL}, started_at {REAL} NOT NULL, ended_at {REAL}, status TEXT NOT NULL,"
    " session_id TEXT, output TEXT, error TEXT, note TEXT, deliver TEXT, delivery TEXT,"
    " delivery_attempts {INTEGER} NOT NULL DEFAULT 0, next_delivery_at {REAL}, delivered_at {REAL},"
    " delivery_error TEXT, holder TEXT)",
    "CREATE INDEX IF NOT EXISTS idx_cron_runs_job ON cron_runs(job_id, id DESC)",
    "CREATE INDEX IF NOT EXISTS idx_cron_runs_outbox ON cron_runs(next_delivery_at) WHERE delivery = 'pending'",
    "CREATE INDEX IF NOT EXISTS idx_cron_runs_running ON cron_runs(status) WHERE status = 'running'",
    "CREATE TABLE IF NOT EXISTS cron_leases ("
    " job_id TEXT PRIMARY KEY, holder TEXT NOT NULL, run_id {INTEGER}, expires_at {REAL} NOT NULL)",
)


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


@overload
def _job(row: None) -> None: ...
@overload
def _job(row: tuple) -> dict: ...
def _job(row: tuple | None) -> dict | None:
    return dict(zip(JOB_FIELDS, row, strict=True)) if row is not None else None


@overload
def _run(row: None) -> None: ...
@overload
def _run(row: tuple) -> dict: ...
def _run(row: tuple | None) -> dict | None:
    return dict(zip(RUN_FIELDS, row, strict=True)) if row is not None else None


def _existing(row: dict | None) -> dict:
    assert row is not None, "read back in the transaction that wrote it"
    return row


_JOB_SELECT = "SELECT " + ", ".join(JOB_FIELDS) + " FROM cron_jobs"
_RUN_SELECT = "SELECT " + ", ".join(RUN_FIELDS) + " FROM cron_runs"


# --- jobs ----------------------------------------------------------------------


def add_cron_job(conn: sqlite3.Connection, job: dict, *, source: str, now: float, next_run_at: float | None) -> dict:
    if conn.execute("SELECT 1 FROM cron_jobs WHERE id = $1", (job["id"],)).fetchone():
        raise CronJobExists(job["id"])
    row = {**{k: job.get(k) for k in EDITABLE}, "id": job["id"], "source": source, "paused": 0,
           "created_at": now, "updated_at": now, "next_run_at": next_run_at, "last_run_at": None}
    conn.execute(
        f"INSERT INTO cron_jobs ({', '.join(JOB_FIELDS)}) VALUES ({numbered(len(JOB_FIELDS))})",
        [row[k] for k in JOB_FIELDS],
    )
    return _job(conn.execute(_JOB_SELECT + " WHERE id = $1", (job["id"],)).fetchone())


def get_cron_job(conn: sqlite3.Connection, job_id: str) -> dict | None:
    return _job(conn.execute(_JOB_SELECT + " WHERE id = $1", (job_id,)).fetchone())


def list_cron_jobs(conn: sqlite3.Connection) -> list[dict]:
    jobs = [_job(r) for r in conn.execute(_JOB_SELECT + " ORDER BY id")]
    last = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT job_id, status, started_at FROM cron_runs WHERE id IN (SELECT MAX(id) FROM cron_runs GROUP BY job_id)")}
    for job in jobs:
        job["last_status"], job["last_started_at"] = last.get(job["id"], (None, None))
    return jobs


def update_cron_job(conn: sqlite3.Connection, job_id: str, changes: dict, *, now: float,
                    next_run_at: float | None | str = "keep") -> dict:
    """Change editable fields (and ``next_run_at`` unless "keep"); bumps ``updated_at``."""
    if get_cron_job(conn, job_id) is None:
        raise CronJobNotFound(job_id)
    sets = {k: v for k, v in changes.items() if k in EDITABLE}
    if next_run_at != "keep":
        sets["next_run_at"] = next_run_at
    sets["updated_at"] = now
    p = Params()
    assignments = ", ".join(f"{k} = {p(v)}" for k, v in sets.items())
    conn.execute(f"UPDATE cron_jobs SET {assignments} WHERE id = {p(job_id)}", p.values)
    return _existing(get_cron_job(conn, job_id))


def set_cron_job_paused(conn: sqlite3.Connection, job_id: str, paused: bool, *, now: float,
                        next_run_at: float | None | str = "keep") -> dict:
    if get_cron_job(conn, job_id) is None:
        raise CronJobNotFound(job_id)
    if next_run_at == "keep":
        conn.execute("UPDATE cron_jobs SET paused = $1, updated_at = $2 WHERE id = $3", (int(paused), now, job_id))
    else:
        conn.execute("UPDATE cron_jobs SET paused = $1, updated_at = $2, next_run_at = $3 WHERE id = $4",
                     (int(paused), now, next_run_at, job_id))
    return _existing(get_cron_job(conn, job_id))


def remove_cron_job(conn: sqlite3.Connection, job_id: str) -> bool:
    """Delete the job, its history and its lease (sessions of past runs stay)."""
    removed = conn.execute("DELETE FROM cron_jobs WHERE id = $1", (job_id,)).rowcount > 0
    conn.execute("DELETE FROM cron_runs WHERE job_id = $1", (job_id,))
    conn.execute("DELETE FROM cron_leases WHERE job_id = $1", (job_id,))
    return removed


def sync_config_cron_jobs(conn: sqlite3.Connection, jobs: list[dict], *, now: float, remove_missing: bool = True) -> dict:
    """Make the ``config`` jobs in the table match ``jobs`` (each with ``next_run_at`` for a new
    or rescheduled job).  A job whose definition is unchanged keeps its ``next_run_at``, so missed
    runs are still found; a CLI job with the same id is refused.  ``config`` jobs not in ``jobs``
    are removed when ``remove_missing`` (the daemon; the CLI may be reading another config file).
    Returns {added, changed, removed}."""
    seen, added, changed = set(), [], []
    for job in jobs:
        seen.add(job["id"])
        old = get_cron_job(conn, job["id"])
        if old is None:
            add_cron_job(conn, job, source="config", now=now, next_run_at=job.get("next_run_at"))
            added.append(job["id"])
            continue
        if old["source"] != "config":
            raise CronJobExists(job["id"], "config")
        if all(old[k] == job.get(k) for k in EDITABLE):
            continue
        sets = {k: job.get(k) for k in EDITABLE}
        keep = old["schedule"] == job["schedule"]
        update_cron_job(conn, job["id"], sets, now=now, next_run_at="keep" if keep else job.get("next_run_at"))
        changed.append(job["id"])
    removed = [r[0] for r in conn.execute("SELECT id FROM cron_jobs WHERE source = 'config'")
               if r[0] not in seen] if remove_missing else []
    for job_id in removed:
        remove_cron_job(conn, job_id)
    return {"added": added, "changed": changed, "removed": removed}


# --- runs and leases ------------------------------------------------------------


def begin_cron_run(conn: sqlite3.Connection, job_id: str, *, holder: str, now: float, lease_seconds: float,
                   trigger: str, scheduled_at: float | None, deliver: str | None,
                   expect_next_run_at: float | None | str = "any", next_run_at: float | None | str = "keep",
                   note: str | None = None) -> dict:
    """Take the job's lease and record a ``running`` run, in one transaction.

    For a scheduled run, ``expect_next_run_at`` must still be the job's
    ``next_run_at`` (another caller may have handled that time already:
    then nothing is written and ``{"status": "stale"}`` comes back), and
    ``next_run_at`` is moved on.  When another holder has an unexpired
    lease, a ``skipped`` run is recorded (and the schedule still moves on);
    the result then has ``status`` "busy" and the ``holder``.
    """
    job = get_cron_job(conn, job_id)
    if job is None:
        raise CronJobNotFound(job_id)
    if expect_next_run_at != "any" and job["next_run_at"] != expect_next_run_at:
        return {"status": "stale", "job": job}
    if next_run_at != "keep":
        conn.execute("UPDATE cron_jobs SET next_run_at = $1, last_run_at = $2 WHERE id = $3", (next_run_at, now, job_id))
    lease = conn.execute("SELECT holder, expires_at FROM cron_leases WHERE job_id = $1", (job_id,)).fetchone()
    if lease is not None and lease[1] > now and lease[0] != holder:
        run_id = _insert_run(conn, job_id, trigger, scheduled_at, now, "skipped", deliver, holder,
                             error=f"the previous run was still going (held by {lease[0]})", ended_at=now)
        return {"status": "busy", "holder": lease[0], "run": get_cron_run(conn, run_id)}
    if lease is not None and lease[1] <= now:
        _interrupt_runs(conn, job_id, now)
    run_id = _insert_run(conn, job_id, trigger, scheduled_at, now, "running", deliver, holder, note=note)
    conn.execute(
        "INSERT INTO cron_leases (job_id, holder, run_id, expires_at) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT(job_id) DO UPDATE SET holder = excluded.holder, run_id = excluded.run_id,"
        " expires_at = excluded.expires_at",
        (job_id, holder, run_id, now + lease_seconds),
    )
    return {"status": "running", "run": get_cron_run(conn, run_id)}


def _insert_run(conn, job_id, trigger, scheduled_at, now, status, deliver, holder, *, error=None, note=None,
                ended_at=None) -> int:
    cur = conn.execute(
        "INSERT INTO cron_runs (job_id, trigger, scheduled_at, started_at, ended_at, status, error, note, deliver, holder)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        (job_id, trigger, scheduled_at, now, ended_at, status, error, note, deliver, holder),
    )
    return int(cur.fetchall()[0][0])


def skip_cron_run(conn: sqlite3.Connection, job_id: str, *, now: float, scheduled_at: float | None,
                  reason: str, expect_next_run_at: float | None, next_run_at: float | None) -> dict | None:
    """Record a run that did not happen (missed beyond the grace period) and move the schedule on."""
    job = get_cron_job(conn, job_id)
    if job is None or job["next_run_at"] != expect_next_run_at:
        return None
    conn.execute("UPDATE cron_jobs SET next_run_at = $1 WHERE id = $2", (next_run_at, job_id))
    run_id = _insert_run(conn, job_id, "schedule", scheduled_at, now, "skipped", job["deliver"], None,
                         error=reason, ended_at=now)
    return get_cron_run(conn, run_id)


def renew_cron_lease(conn: sqlite3.Connection, job_id: str, holder: str, *, now: float, lease_seconds: float) -> bool:
    """Extend our lease; False when it is no longer ours (it expired and someone took it)."""
    return conn.execute(
        "UPDATE cron_leases SET expires_at = $1 WHERE job_id = $2 AND holder = $3", (now + lease_seconds, job_id, holder),
    ).rowcount > 0


def get_cron_lease(conn: sqlite3.Connection, job_id: str) -> dict | None:
    row = conn.execute("SELECT job_id, holder, run_id, expires_at FROM cron_leases WHERE job_id = $1", (job_id,)).fetchone()
    return dict(zip(("job_id", "holder", "run_id", "expires_at"), row, strict=True)) if row else None


def finish_cron_run(conn: sqlite3.Connection, run_id: int, *, holder: str, now: float, status: str,
                    session_id: str | None = None, output: str | None = None, error: str | None = None,
                    delivery: str | None = None, next_delivery_at: float | None = None) -> dict | None:
    """Record how the run ended and release the lease (if still ours); None if the job was removed."""
    conn.execute(
        "UPDATE cron_runs SET ended_at = $1, status = $2, session_id = COALESCE($3, session_id), output = $4, error = $5,"
        " delivery = $6, next_delivery_at = $7 WHERE id = $8",
        (now, status, session_id, output, error, delivery, next_delivery_at, run_id),
    )
    run = get_cron_run(conn, run_id)
    if run is None:  # the job was removed while it ran (its history went with it)
        conn.execute("DELETE FROM cron_leases WHERE run_id = $1 AND holder = $2", (run_id, holder))
        return None
    conn.execute("DELETE FROM cron_leases WHERE job_id = $1 AND holder = $2", (run["job_id"], holder))
    _prune_runs(conn, run["job_id"])
    return run


def _prune_runs(conn: sqlite3.Connection, job_id: str, keep: int = KEEP_RUNS) -> None:
    """Keep the newest ``keep`` runs of a job; older ones go unless a delivery still waits."""
    conn.execute(
        "DELETE FROM cron_runs WHERE job_id = $1 AND status != 'running' AND COALESCE(delivery, '') != 'pending'"
        " AND id < (SELECT id FROM cron_runs WHERE job_id = $2 ORDER BY id DESC LIMIT 1 OFFSET $3)",
        (job_id, job_id, keep - 1),
    )


def set_cron_run_session(conn: sqlite3.Connection, run_id: int, session_id: str) -> None:
    conn.execute("UPDATE cron_runs SET session_id = $1 WHERE id = $2", (session_id, run_id))


def get_cron_run(conn: sqlite3.Connection, run_id: int) -> dict | None:
    return _run(conn.execute(_RUN_SELECT + " WHERE id = $1", (run_id,)).fetchone())


def list_cron_runs(conn: sqlite3.Connection, job_id: str | None = None, limit: int = 20) -> list[dict]:
    if job_id is None:
        rows = conn.execute(_RUN_SELECT + " ORDER BY id DESC LIMIT $1", (limit,))
    else:
        rows = conn.execute(_RUN_SELECT + " WHERE job_id = $1 ORDER BY id DESC LIMIT $2", (job_id, limit))
    return [_run(r) for r in rows]


def _interrupt_runs(conn: sqlite3.Connection, job_id: str | None, now: float) -> list[dict]:
    """Runs left ``running`` by a process that is gone (its lease expired): error, session ended."""
    sql = (_RUN_SELECT + " WHERE status = 'running' AND NOT EXISTS (SELECT 1 FROM cron_leases l"
           " WHERE l.job_id = cron_runs.job_id AND l.run_id = cron_runs.id AND l.expires_at > $1)")
    p = Params(now)
    if job_id is not None:
        sql += f" AND job_id = {p(job_id)}"
    runs = [_run(r) for r in conn.execute(sql, p.values)]
    for run in runs:
        conn.execute(
            "UPDATE cron_runs SET status = 'error', ended_at = $1, error = $2 WHERE id = $3",
            (now, "interrupted: the process running it stopped before it finished", run["id"]),
        )
        if run["session_id"]:
            _sessions.end_session(conn, run["session_id"], "cron_error")
    if job_id is None:
        conn.execute("DELETE FROM cron_leases WHERE expires_at <= $1", (now,))
    return runs


def reap_cron_runs(conn: sqlite3.Connection, *, now: float) -> list[dict]:
    """Mark runs whose process died (lease expired) as interrupted errors; returns them."""
    return _interrupt_runs(conn, None, now)


# --- the delivery outbox -----------------------------------------------------------


def due_cron_deliveries(conn: sqlite3.Connection, *, now: float, limit: int = 50) -> list[dict]:
    return [_run(r) for r in conn.execute(
        _RUN_SELECT + " WHERE delivery = 'pending' AND next_delivery_at <= $1 ORDER BY next_delivery_at LIMIT $2",
        (now, limit))]


def claim_cron_delivery(conn: sqlite3.Connection, run_id: int, *, now: float, hold_seconds: float) -> dict | None:
    """Take a due delivery for one attempt (it comes due again after ``hold_seconds`` if the
    process dies mid-send); None when it is not due or someone else took it."""
    cur = conn.execute(
        "UPDATE cron_runs SET next_delivery_at = $1 WHERE id = $2 AND delivery = 'pending' AND next_delivery_at <= $3",
        (now + hold_seconds, run_id, now),
    )
    return get_cron_run(conn, run_id) if cur.rowcount else None


def record_cron_delivery(conn: sqlite3.Connection, run_id: int, *, now: float, ok: bool, error: str | None = None,
                         retry_at: float | None = None) -> dict | None:
    """One delivery attempt's outcome: delivered (status ok), or failed (status delivery_failed),
    to be retried at ``retry_at`` or, when None, given up.  The run as recorded; None when its job
    was removed while it was being delivered."""
    if ok:
        conn.execute(
            "UPDATE cron_runs SET delivery = 'delivered', delivered_at = $1, next_delivery_at = NULL, status = 'ok',"
            " delivery_attempts = delivery_attempts + 1 WHERE id = $2", (now, run_id))
    else:
        conn.execute(
            "UPDATE cron_runs SET delivery = $1, next_delivery_at = $2, status = 'delivery_failed', delivery_error = $3,"
            " delivery_attempts = delivery_attempts + 1 WHERE id = $4",
            ("pending" if retry_at is not None else "failed", retry_at, error, run_id))
    return get_cron_run(conn, run_id)



def _in_turn(conn: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn`` after the one ``cron`` advisory lock (PostgreSQL): cron's writes read the jobs, runs and leases
    they go on to change (a lease held or not, a run still running, the next time due), and are few."""
    dialect_of(conn).serialize(conn, "cron")
    return fn(conn, *args, **kwargs)

class CronJobs(Repository):
    """``db.cron``: scheduled jobs, their runs and leases; times come from the caller's clock."""

    def _write(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return self._engine.write(_in_turn, fn, *args, **kwargs)

    @writes
    def add_job(self, job: dict, *, source: str, now: float, next_run_at: float | None) -> dict:
        """Store a new job (``job`` holds id and the editable fields); raises ``CronJobExists``."""
        return self._write(add_cron_job, dict(job), source=source, now=now, next_run_at=next_run_at)

    @reads
    def get_job(self, job_id: str) -> dict | None:
        return self._engine.read(get_cron_job, job_id)

    @reads
    def list_jobs(self) -> list[dict]:
        """Every job, by id, with ``last_status`` and ``last_started_at`` of its newest run."""
        return self._engine.read(list_cron_jobs)

    @writes
    def update_job(self, job_id: str, changes: dict, *, now: float, next_run_at: Any = "keep") -> dict:
        return self._write(update_cron_job, job_id, dict(changes), now=now, next_run_at=next_run_at)

    @writes
    def set_paused(self, job_id: str, paused: bool, *, now: float, next_run_at: Any = "keep") -> dict:
        return self._write(set_cron_job_paused, job_id, paused, now=now, next_run_at=next_run_at)

    @writes
    def remove_job(self, job_id: str) -> bool:
        """Delete the job with its history and lease; the sessions of its runs stay."""
        return self._write(remove_cron_job, job_id)

    @writes
    def sync_config_jobs(self, jobs: list[dict], *, now: float, remove_missing: bool = True) -> dict:
        """Make the table's ``config`` jobs match ``jobs``; returns {added, changed, removed}."""
        return self._write(sync_config_cron_jobs, [dict(j) for j in jobs], now=now,
                                  remove_missing=remove_missing)

    @writes
    def begin_run(self, job_id: str, *, holder: str, now: float, lease_seconds: float, trigger: str,
                  scheduled_at: float | None, deliver: str | None, expect_next_run_at: Any = "any",
                  next_run_at: Any = "keep", note: str | None = None) -> dict:
        """Take the job's lease and record a running run in one transaction (see ``state._cron``)."""
        return self._write(
            begin_cron_run, job_id, holder=holder, now=now, lease_seconds=lease_seconds, trigger=trigger,
            scheduled_at=scheduled_at, deliver=deliver, expect_next_run_at=expect_next_run_at,
            next_run_at=next_run_at, note=note,
        )

    @writes
    def skip_run(self, job_id: str, *, now: float, scheduled_at: float | None, reason: str,
                 expect_next_run_at: float | None, next_run_at: float | None) -> dict | None:
        return self._write(skip_cron_run, job_id, now=now, scheduled_at=scheduled_at, reason=reason,
                                  expect_next_run_at=expect_next_run_at, next_run_at=next_run_at)

    @writes
    def renew_lease(self, job_id: str, holder: str, *, now: float, lease_seconds: float) -> bool:
        return self._write(renew_cron_lease, job_id, holder, now=now, lease_seconds=lease_seconds)

    @reads
    def get_lease(self, job_id: str) -> dict | None:
        return self._engine.read(get_cron_lease, job_id)

    @writes
    def set_run_session(self, run_id: int, session_id: str) -> None:
        return self._write(set_cron_run_session, run_id, session_id)

    @writes
    def finish_run(self, run_id: int, *, holder: str, now: float, status: str, session_id: str | None = None,
                   output: str | None = None, error: str | None = None, delivery: str | None = None,
                   next_delivery_at: float | None = None) -> dict | None:
        """Record the run's end and release the lease; None when the job was removed meanwhile."""
        return self._write(
            finish_cron_run, run_id, holder=holder, now=now, status=status, session_id=session_id,
            output=output, error=error, delivery=delivery, next_delivery_at=next_delivery_at,
        )

    @reads
    def get_run(self, run_id: int) -> dict | None:
        return self._engine.read(get_cron_run, run_id)

    @reads
    def list_runs(self, job_id: str | None = None, limit: int = 20) -> list[dict]:
        """Newest first."""
        return self._engine.read(list_cron_runs, job_id, limit)

    @writes
    def reap_runs(self, *, now: float) -> list[dict]:
        """Runs left running by a process that died (lease expired) become errors."""
        return self._write(reap_cron_runs, now=now)

    @reads
    def due_deliveries(self, *, now: float, limit: int = 50) -> list[dict]:
        return self._engine.read(due_cron_deliveries, now=now, limit=limit)

    @writes
    def claim_delivery(self, run_id: int, *, now: float, hold_seconds: float) -> dict | None:
        return self._write(claim_cron_delivery, run_id, now=now, hold_seconds=hold_seconds)

    @writes
    def record_delivery(self, run_id: int, *, now: float, ok: bool, error: str | None = None,
                        retry_at: float | None = None) -> dict | None:
        return self._write(record_cron_delivery, run_id, now=now, ok=ok, error=error, retry_at=retry_at)
