"""What differs between the store's two engines, for the feature modules that write SQL.

A leaf: it imports nothing of the store, so every module may ask it.
"""

from __future__ import annotations

from typing import Any


def is_pg(conn: Any) -> bool:
    """Whether a store function runs on PostgreSQL (a ``state._pg.PgConnection``) rather than sqlite3."""
    return getattr(conn, "dialect", "sqlite") == "postgresql"


def json_values(conn: Any, *, integers: bool = False) -> str:
    """A subquery yielding the elements of a JSON array passed as one ``?`` parameter (``IN (...)``
    over many ids without one placeholder each): SQLite's ``json_each``, PostgreSQL's
    ``jsonb_array_elements_text`` (cast to ``BIGINT`` for ids)."""
    if not is_pg(conn):
        return "SELECT value FROM json_each(?)"
    if integers:
        return "SELECT CAST(jsonb_array_elements_text(CAST(? AS jsonb)) AS BIGINT)"
    return "SELECT jsonb_array_elements_text(CAST(? AS jsonb))"


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
