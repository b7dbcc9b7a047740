"""Every PostgreSQL connection the store opens has TCP keepalives, a user timeout and a statement
timeout, so a partition that drops packets fails a statement within seconds instead of hanging it.

(The partition itself, packets dropped rather than refused, needs a network namespace and is not
tested here.)
"""

from __future__ import annotations

import asyncio

from state import SessionDB
from state._liveness import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE_SECONDS,
    KEEPALIVE_INTERVAL_SECONDS,
    STATEMENT_TIMEOUT_MS,
    TCP_USER_TIMEOUT_MS,
)

EXPECTED = {"keepalives": "1", "keepalives_idle": str(KEEPALIVE_IDLE_SECONDS),
            "keepalives_interval": str(KEEPALIVE_INTERVAL_SECONDS), "keepalives_count": str(KEEPALIVE_COUNT),
            "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS)}


def _liveness(raw) -> tuple[str, dict[str, str]]:
    """A psycopg connection's statement timeout (asked of the server) and its keepalive parameters."""
    timeout = raw.execute("SHOW statement_timeout").fetchone()[0]
    params = raw.info.get_parameters()
    return timeout, {k: params.get(k) for k in EXPECTED}


def test_a_pooled_store_connection_has_keepalives_and_a_statement_timeout(pg_url):
    db = SessionDB(pg_url)
    try:
        timeout, params = db._engine.read(lambda conn: _liveness(conn))
    finally:
        db.close()
    assert timeout == f"{STATEMENT_TIMEOUT_MS // 1000}s"
    assert params == EXPECTED


def test_the_statement_timeout_keeps_the_options_the_url_already_has(pg_url):
    sep = "&" if "?" in pg_url else "?"
    db = SessionDB(f"{pg_url}{sep}options=-c%20search_path%3Dpublic%20-c%20lock_timeout%3D7000")
    try:
        timeouts = db._engine.read(lambda conn: [conn.execute(f"SHOW {name}").fetchone()[0]
                                                 for name in ("statement_timeout", "lock_timeout")])
    finally:
        db.close()
    assert timeouts == [f"{STATEMENT_TIMEOUT_MS // 1000}s", "7s"]


def test_the_rate_budgets_connection_has_keepalives_and_a_statement_timeout(pg_url):
    db = SessionDB(pg_url)
    cluster = db.cluster
    assert cluster is not None

    async def ask():
        buckets = cluster.rate_budgets()
        try:
            async def step(conn):
                cur = await conn.execute("SHOW statement_timeout")
                timeout = (await cur.fetchone())[0]
                params = conn.info.get_parameters()
                return timeout, {k: params.get(k) for k in EXPECTED}

            return await buckets._run(step)
        finally:
            await buckets.close()

    try:
        timeout, params = asyncio.run(ask())
    finally:
        db.close()
    assert timeout == f"{STATEMENT_TIMEOUT_MS // 1000}s"
    assert params == EXPECTED
