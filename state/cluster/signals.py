"""What one instance tells the others at once: ``LISTEN/NOTIFY`` on one channel, polling behind it.

    signals = cluster.signals(on_signal)      # a connection of its own, LISTENing
    await signals.start()                     # on_signal("work") / on_signal("stop") as they come
    ...
    await signals.close()

Two signals travel on the channel :data:`CHANNEL`, each sent inside the transaction that makes it
true, so it is delivered when (and only if) that transaction commits:

* ``work``: a session was marked pending (:func:`state.cluster.mark_pending`, the sweeper, a
  release that left work): claim loops look at once instead of at their next poll;
* ``stop``: a chat's ``/stop`` was written to the store (:func:`ask_stop`): the instance running
  that chat's turn reads it (:func:`stops_asked`) and stops the turn.

A notification is a wake-up, never the only record: what it announces is in the tables, and
every instance still polls them (claims every 0.5 s, stops every 0.5 s while it runs turns), so a
listener that lost its connection costs speed, not correctness.  The listener reconnects on its
own, with the store's keepalives, and on every (re)connect wakes both pollers to catch up.

A ``/stop`` is a row of ``chat_prefs`` (name ``stop``, ``updated_at`` from the database's clock):
it stops a turn of that chat claimed before it was asked, on whichever instance runs it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import psycopg

from .._liveness import connection_kwargs
from ._sql import execute

log = logging.getLogger(__name__)

CHANNEL = "switchboard_cluster"
WORK = "work"
STOP = "stop"
_NOW = "extract(epoch FROM clock_timestamp())"
RECONNECT_SECONDS = (0.5, 1.0, 2.0, 5.0)


def notify(conn: psycopg.Connection, signal: str) -> None:
    """Send ``signal`` to every listening instance when the caller's transaction commits."""
    execute(conn, "SELECT pg_notify($1, $2)", (CHANNEL, signal))


def ask_stop(conn: psycopg.Connection, session_key: str, session_id: str | None) -> bool:
    """Record the chat's ``/stop`` (with the database's time) and signal it; whether a turn of
    ``session_id`` runs or waits anywhere now (a live lease, or work pending)."""
    execute(
        conn,
        f"INSERT INTO chat_prefs (session_key, name, value, updated_at) VALUES ($1, 'stop', '', {_NOW})"
        f" ON CONFLICT (session_key, name) DO UPDATE SET updated_at = excluded.updated_at",
        (session_key,),
    )
    notify(conn, STOP)
    return session_id is not None and work_waiting(conn, session_id)


def stops_asked(conn: psycopg.Connection, session_keys: list[str], since: float) -> list[tuple[str, float]]:
    """The ``/stop`` of each of ``session_keys`` asked after ``since`` (database time): (key, when)."""
    if not session_keys:
        return []
    rows = execute(
        conn,
        "SELECT session_key, updated_at FROM chat_prefs"
        " WHERE name = 'stop' AND session_key = ANY($1) AND updated_at > $2",
        (list(session_keys), since),
    ).fetchall()
    return [(key, float(at)) for key, at in rows]


def work_waiting(conn: psycopg.Connection, session_id: str) -> bool:
    """Whether a turn of the session runs on some instance (a live lease) or waits to be claimed."""
    row = execute(
        conn,
        f"SELECT (holder IS NOT NULL AND expires_at > {_NOW}) OR pending_since IS NOT NULL"
        f" FROM work_leases WHERE session_id = $1",
        (session_id,),
    ).fetchone()
    return bool(row and row[0])


class Signals:
    """A connection of its own that LISTENs on :data:`CHANNEL` and hands each payload to ``on_signal``.

    ``on_signal`` runs on the event loop and must not block.  :attr:`listening` says whether the
    connection is up (``/healthz``): while it is not, the instances fall back to polling.
    """

    def __init__(self, url: str, on_signal: Callable[[str], Any]):
        self._url = url
        self._on_signal = on_signal
        self._conn: psycopg.AsyncConnection | None = None
        self.listening = False
        self.received = 0  # notifications handed on since start

    async def close(self) -> None:
        """After the task running :meth:`run` was cancelled: the connection goes."""
        await self._disconnect()

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self.listening = False
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - it is going away either way
                pass

    async def run(self) -> None:
        """Listen until cancelled (run it as a task), reconnecting with a backoff when the connection fails."""
        failures = 0
        while True:
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, application_name="switchboard-signals",
                    **connection_kwargs(self._url))
                await self._conn.execute(f"LISTEN {CHANNEL}")
                self.listening = True
                if failures:
                    log.info("listening for the other instances' signals again")
                failures = 0
                for signal in (WORK, STOP):  # whatever was signalled while not listening
                    self._on_signal(signal)
                async for note in self._conn.notifies():
                    self.received += 1
                    self._on_signal(note.payload)
                raise psycopg.OperationalError("the server ended the notifications")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - polling covers meanwhile; listening comes back
                wait = RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS) - 1)]
                failures += 1
                log.warning("not listening for the other instances' signals (%s); polling meanwhile, "
                            "reconnecting in %.1fs", exc, wait)
            await self._disconnect()
            await asyncio.sleep(wait)
