"""The cluster's statements, written with PostgreSQL's own ``$1, $2, ...``, run on any psycopg connection.

Each is sent through a ``RawCursor`` of its own (psycopg passes the text as it is, as the store's
connections do, ``state._pg_conn``), so a cluster function works the same on the store's pooled
connections and on a connection of its own that a caller opened with psycopg's defaults.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg


def execute(conn: psycopg.Connection, sql: str, params: Sequence[Any] = ()) -> psycopg.RawCursor:
    """``sql`` with ``params`` for ``$1 ...`` on ``conn``; its cursor, to fetch from."""
    return psycopg.RawCursor(conn).execute(sql, params or None)


async def execute_async(conn: psycopg.AsyncConnection, sql: str, params: Sequence[Any] = ()) -> psycopg.AsyncRawCursor:
    """:func:`execute` on an async connection."""
    return await psycopg.AsyncRawCursor(conn).execute(sql, params or None)
