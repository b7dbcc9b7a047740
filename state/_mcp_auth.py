"""What the OAuth sign-ins to remote MCP servers keep: tokens, client registrations, flows under way.

    mcp_auth        one row per (server, principal, kind): ``tokens`` (a principal's access and refresh
                    token, for ``operator`` or ``<platform>:<user_id>``) or ``client`` (the server's
                    client registration, principal ``""``); ``data`` is ciphertext, sealed by the
                    gateway (``gateway.tools_mcp.vault``) before it reaches this module
    mcp_auth_flows  one row per sign-in link sent and not yet used: keyed by the SHA-256 of its
                    ``state`` (the secret ``state`` itself is never stored), the server and principal
                    it signs in, the chat to tell, and ``data`` (ciphertext: the PKCE code verifier and
                    what the token request needs)

This module never sees a secret in the clear: it stores and returns what it was given.  A flow is
taken once (:func:`take_flow` deletes it in the same transaction that reads it), so a callback
replayed, or hit on two instances at once, completes one sign-in.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import numbered

#: The tables (schema v37), written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS mcp_auth (
        server TEXT NOT NULL,
        principal TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        expires_at {REAL},
        updated_at {REAL} NOT NULL,
        PRIMARY KEY (server, principal, kind)
    )""",
    """CREATE TABLE IF NOT EXISTS mcp_auth_flows (
        state_hash TEXT PRIMARY KEY,
        server TEXT NOT NULL,
        principal TEXT NOT NULL,
        platform TEXT,
        chat_id TEXT,
        thread_id TEXT,
        data TEXT NOT NULL,
        created_at {REAL} NOT NULL,
        expires_at {REAL} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_mcp_auth_flows_expiry ON mcp_auth_flows(expires_at)",
)

KINDS = ("tokens", "client")
FLOW_COLUMNS = ("state_hash", "server", "principal", "platform", "chat_id", "thread_id", "data", "created_at",
                "expires_at")


def create_tables(conn: sqlite3.Connection) -> None:
    dialect_of(conn).create(conn, TABLES)


def put_secret(conn: sqlite3.Connection, server: str, principal: str, kind: str, data: str,
               expires_at: float | None, now: float) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    conn.execute("DELETE FROM mcp_auth WHERE server = $1 AND principal = $2 AND kind = $3", (server, principal, kind))
    conn.execute("INSERT INTO mcp_auth (server, principal, kind, data, expires_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
                 (server, principal, kind, data, expires_at, now))


def get_secret(conn: sqlite3.Connection, server: str, principal: str, kind: str) -> str | None:
    row = conn.execute("SELECT data FROM mcp_auth WHERE server = $1 AND principal = $2 AND kind = $3",
                       (server, principal, kind)).fetchone()
    return row[0] if row else None


def drop_secrets(conn: sqlite3.Connection, server: str, principal: str | None, kind: str) -> int:
    """Delete ``kind`` rows of ``server`` for ``principal`` (None: every principal); how many went."""
    if principal is None:
        cur = conn.execute("DELETE FROM mcp_auth WHERE server = $1 AND kind = $2", (server, kind))
    else:
        cur = conn.execute("DELETE FROM mcp_auth WHERE server = $1 AND principal = $2 AND kind = $3",
                           (server, principal, kind))
    return cur.rowcount


def principals(conn: sqlite3.Connection, server: str) -> list[str]:
    """Who holds tokens for ``server``, the most recently signed in first."""
    rows = conn.execute("SELECT principal FROM mcp_auth WHERE server = $1 AND kind = 'tokens' "
                        "ORDER BY updated_at DESC, principal", (server,)).fetchall()
    return [r[0] for r in rows]


def add_flow(conn: sqlite3.Connection, row: dict) -> None:
    values = {**{c: None for c in FLOW_COLUMNS}, **row}
    conn.execute("DELETE FROM mcp_auth_flows WHERE expires_at < $1", (values["created_at"],))
    conn.execute(f"INSERT INTO mcp_auth_flows ({', '.join(FLOW_COLUMNS)}) VALUES ({numbered(len(FLOW_COLUMNS))})",
                 tuple(values[c] for c in FLOW_COLUMNS))


def take_flow(conn: sqlite3.Connection, state_hash: str, now: float) -> dict | None:
    """The flow of ``state_hash``, deleted as it is read (None: unknown, used already, or expired)."""
    row = conn.execute(f"SELECT {', '.join(FLOW_COLUMNS)} FROM mcp_auth_flows WHERE state_hash = $1",
                       (state_hash,)).fetchone()
    if row is None:
        return None
    cur = conn.execute("DELETE FROM mcp_auth_flows WHERE state_hash = $1", (state_hash,))
    if cur.rowcount != 1:
        return None
    flow: dict[str, Any] = dict(zip(FLOW_COLUMNS, row, strict=True))
    return flow if flow["expires_at"] >= now else None


class McpAuthStore(Repository):
    """``db.mcp_auth``: the MCP servers' OAuth tokens, client registrations and sign-ins under way
    (every secret sealed by the caller)."""

    @writes
    def put(self, server: str, principal: str, kind: str, data: str, *, expires_at: float | None = None,
            now: float) -> None:
        return self._engine.write(put_secret, server, principal, kind, data, expires_at, now)

    @reads
    def get(self, server: str, principal: str, kind: str) -> str | None:
        return self._engine.read(get_secret, server, principal, kind)

    @writes
    def drop(self, server: str, principal: str | None, kind: str = "tokens") -> int:
        return self._engine.write(drop_secrets, server, principal, kind)

    @reads
    def principals(self, server: str) -> list[str]:
        return self._engine.read(principals, server)

    @writes
    def add_flow(self, row: dict) -> None:
        """Store a sign-in under way (``FLOW_COLUMNS``); expired ones are cleared on the way."""
        return self._engine.write(add_flow, row)

    @writes
    def take_flow(self, state_hash: str, *, now: float) -> dict | None:
        return self._engine.write(take_flow, state_hash, now)
