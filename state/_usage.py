"""The usage ledger: one row per model call.

    model_calls   when, for whom (session, platform, chat, user, agent), why (purpose),
                  which model, its tokens, latency and outcome, the price used and the cost

Tokens are stored as the endpoint reported them: ``prompt_tokens`` counts every
input token, the cached reads among them too (``cached_tokens``, a part of
``prompt_tokens``, never added to it).  ``estimated`` is 1 when the endpoint
reported no usage and the gateway counted for itself.  The price used (per
million tokens) is stored beside the cost, so a cost can be recomputed; a row
without a price has ``cost`` NULL ("no price").

A row's platform and user come from its session when the caller did not know
them.  The rows of a deleted session go with it (``sessions prune``, the
daemon's retention); :func:`prune_calls` drops rows older than a cutoff
(``usage.keep_days``).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any

_EPOCH = dt.date(1970, 1, 1)

# Columns a report can be grouped by; "day" is the UTC date of the call.
GROUPS = {
    "day": "CAST(at / 86400 AS INTEGER)",
    "model": "model",
    "platform": "COALESCE(platform, '?')",
    "purpose": "purpose",
    "user": "COALESCE(platform, '?') || ':' || COALESCE(user_id, '?')",
    "chat": "COALESCE(platform, '?') || ':' || COALESCE(chat_id, '?')",
}

COLUMNS = ("at", "session_id", "platform", "chat_id", "user_id", "agent", "purpose", "model", "prompt_tokens",
           "completion_tokens", "cached_tokens", "cache_write_tokens", "estimated", "latency_ms", "outcome",
           "error", "attempts", "price_input", "price_output", "price_cached_input", "cost")
_DEFAULTS = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "cache_write_tokens": 0, "estimated": 0,
             "attempts": 1}


def create_tables(conn: sqlite3.Connection) -> None:
    """Schema v20: the ledger and the indexes its reports use (by time; by session for deletes)."""
    conn.execute(
        """CREATE TABLE IF NOT EXISTS model_calls (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            session_id TEXT,
            platform TEXT,
            chat_id TEXT,
            user_id TEXT,
            agent TEXT,
            purpose TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            cache_write_tokens INTEGER NOT NULL DEFAULT 0,
            estimated INTEGER NOT NULL DEFAULT 0,
            latency_ms REAL,
            outcome TEXT NOT NULL,
            error TEXT,
            attempts INTEGER NOT NULL DEFAULT 1,
            price_input REAL,
            price_output REAL,
            price_cached_input REAL,
            cost REAL
        )"""
    )
    conn.execute("CREATE INDEX IF NOT EXISTS idx_model_calls_at ON model_calls(at)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_model_calls_session ON model_calls(session_id)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_model_calls_user ON model_calls(user_id, at)")


def record_call(conn: sqlite3.Connection, row: dict) -> int:
    """Add one call; a missing platform or user is taken from the call's session."""
    values = {name: row[name] if row.get(name) is not None else _DEFAULTS.get(name) for name in COLUMNS}
    if values["session_id"] and (values["platform"] is None or values["user_id"] is None):
        found = conn.execute("SELECT source, user_id FROM sessions WHERE id = ?", (values["session_id"],)).fetchone()
        if found is not None:
            values["platform"] = values["platform"] or found[0]
            values["user_id"] = values["user_id"] or found[1]
    marks = ", ".join("?" * len(COLUMNS))
    cur = conn.execute(f"INSERT INTO model_calls ({', '.join(COLUMNS)}) VALUES ({marks})",
                       [values[name] for name in COLUMNS])
    return int(cur.lastrowid or 0)


def record_calls(conn: sqlite3.Connection, rows: list[dict]) -> list[int]:
    return [record_call(conn, row) for row in rows]


def list_calls(conn: sqlite3.Connection, since: float, limit: int = 1000) -> list[dict]:
    """The calls since ``since``, oldest first."""
    cur = conn.execute(f"SELECT id, {', '.join(COLUMNS)} FROM model_calls WHERE at >= ? ORDER BY at, id LIMIT ?",
                       (since, limit))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur]


def usage_report(conn: sqlite3.Connection, since: float, by: str, *, platform: str | None = None,
                 user_id: str | None = None) -> list[dict]:
    """Totals per group and UTC day (``YYYY-MM-DD``) since ``since``: one dict per (group, day).

    ``platform`` and ``user_id`` together keep one user's calls only."""
    if by not in GROUPS:
        raise ValueError(f"cannot group usage by {by!r}; choose one of {', '.join(GROUPS)}")
    where = "at >= ?"
    params: list[Any] = [since]
    if user_id is not None:
        where += " AND platform IS ? AND user_id = ?"
        params += [platform, user_id]
    cur = conn.execute(
        f"SELECT {GROUPS[by]} AS grp, CAST(at / 86400 AS INTEGER) AS day, COUNT(*) AS calls, "
        "SUM(prompt_tokens - cached_tokens) AS input_tokens, SUM(cached_tokens) AS cached_input_tokens, "
        "SUM(completion_tokens) AS output_tokens, SUM(cache_write_tokens) AS cache_write_tokens, "
        "SUM(cost) AS cost, SUM(cost IS NULL) AS unpriced, SUM(estimated) AS estimated, "
        "SUM(outcome = 'failed') AS failed, SUM(outcome = 'retried') AS retried "
        f"FROM model_calls WHERE {where} GROUP BY grp, day",
        params)
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur]
    days = {row["day"] for row in rows}
    dates = {day: (_EPOCH + dt.timedelta(days=day)).isoformat() for day in days}  # the UTC date, once per day
    for row in rows:
        row["day"] = dates[row["day"]]
        if by == "day":
            row["grp"] = row["day"]
    return rows


def reprice_calls(conn: sqlite3.Connection, model: str, price: dict[str, float] | None, since: float = 0.0) -> int:
    """Recompute the cost of ``model``'s calls since ``since`` with ``price`` (None: no price); how many."""
    if price is None:
        return conn.execute("UPDATE model_calls SET price_input = NULL, price_output = NULL, "
                            "price_cached_input = NULL, cost = NULL WHERE model = ? AND at >= ?",
                            (model, since)).rowcount
    cached = price.get("cached_input", price["input"])
    return conn.execute(
        "UPDATE model_calls SET price_input = :i, price_output = :o, price_cached_input = :c, "
        "cost = ((prompt_tokens - cached_tokens) * :i + cached_tokens * :c + completion_tokens * :o) / 1e6 "
        "WHERE model = :m AND at >= :s",
        {"i": price["input"], "o": price["output"], "c": cached, "m": model, "s": since}).rowcount


def forget_sessions(conn: sqlite3.Connection, marks: str, chunk: list[str]) -> None:
    """Part of deleting sessions: their calls go with them."""
    conn.execute(f"DELETE FROM model_calls WHERE session_id IN ({marks})", chunk)


def prune_calls(conn: sqlite3.Connection, before: float) -> int:
    """Delete the calls made before ``before``; how many."""
    return conn.execute("DELETE FROM model_calls WHERE at < ?", (before,)).rowcount

