"""What every PostgreSQL connection the store opens asks of the network and of the server.

A partition that drops packets (a cable pulled, a firewall that stops answering) is not
a refused connection: without help, a statement waits for an answer until the kernel gives
up, many minutes later.  So each connection of the store's pool and of its rate budgets
(``state.cluster.budgets``) gets:

* TCP keepalives: a silent server is found out after ``IDLE + INTERVAL x COUNT`` = 10 s of
  silence (the client is waiting for an answer, nothing of its own is unacknowledged);
* ``tcp_user_timeout``: data sent that the server has not acknowledged for 10 s ends the
  connection (a statement sent into the partition);
* a server-side ``statement_timeout``: no statement holds a connection (and its locks) for
  longer than :data:`STATEMENT_TIMEOUT_MS`; the schema migration lifts it for itself.

A statement cut off this way fails with psycopg's ``OperationalError``; the pool drops the
connection and the next call opens a new one once the server answers again.  These are
constants, not settings: they bound failure detection, not any normal statement, which takes
milliseconds.  A connection owner (``state.cluster.owner``) sets its own, tighter values,
derived from ``cluster.failover_seconds``.
"""

from __future__ import annotations

from typing import Any

KEEPALIVE_IDLE_SECONDS = 4  # silence before the first probe
KEEPALIVE_INTERVAL_SECONDS = 2  # between probes
KEEPALIVE_COUNT = 3  # unanswered probes before the connection is dead: 4 + 2 x 3 = 10 s
TCP_USER_TIMEOUT_MS = 10_000  # unacknowledged data for this long ends the connection
STATEMENT_TIMEOUT_MS = 30_000  # the server cancels any statement running longer


def connection_kwargs(url: str, *, statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> dict[str, Any]:
    """psycopg ``connect`` keyword arguments for a store connection to ``url``: keepalives, the user
    timeout and the statement timeout (added to any ``options`` the URL already has)."""
    from psycopg.conninfo import conninfo_to_dict

    options = str(conninfo_to_dict(url).get("options") or "").strip()
    return {
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
        "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
        "keepalives_count": KEEPALIVE_COUNT,
        "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
        "options": f"{options} -c statement_timeout={int(statement_timeout_ms)}".strip(),
    }
