"""A repository: one feature's reads and writes, hanging off the store as ``db.<name>``.

Each feature of the store keeps its SQL in a module of its own (``state._prefs``,
``state._cron``, ...).  A :class:`Repository` in that module is the feature's face: its public
methods each run one function of the module through the engine, and are marked
:func:`reads`, :func:`writes` or :func:`upkeep_steps`.  :class:`state.SessionDB` lists its
repositories in ``REPOSITORIES`` and builds one of each over its engine; :class:`state.AsyncSessionDB`
builds the same repositories as coroutines from the marks (a read goes to a reader thread, a write
to the writer), so the daemon runs exactly this code and there is no second copy of any SQL.

A new feature adds a module with its ``TABLES``, its functions and its repository, names the
repository in ``SessionDB.REPOSITORIES``, and runs ``.venv/bin/python -m state._gen_aio_face``
so that mypy sees its coroutines::

    class ChatPrefs(Repository):
        @writes
        def set(self, session_key: str, name: str, value: str, *, now: float) -> None:
            return self._engine.write(set_chat_pref, session_key, name, value, now=now)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class StoreEngine(Protocol):
    """What a repository needs of an engine (``state._engine.Engine`` on SQLite,
    ``state._pg.PgEngine`` on PostgreSQL): run a function of a feature module on a connection,
    to read, or to write in one transaction."""

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...

    def write_giving_way(self, fn: Callable[..., T], /, *args: Any) -> T: ...

#: the kinds a public method of a repository (or of SessionDB) is marked with
KINDS = ("read", "write", "upkeep")


def reads(method: F) -> F:
    """A method that only reads: it runs on one of the async store's reader threads."""
    method._state_kind = "read"  # type: ignore[attr-defined]
    return method


def writes(method: F) -> F:
    """A method that writes: it runs on the async store's writer thread, in one transaction."""
    method._state_kind = "write"  # type: ignore[attr-defined]
    return method


def upkeep_steps(method: F) -> F:
    """A write that gives way to the others (the async store runs it on a thread of its own, so
    that a write coming meanwhile reaches the lock and interrupts it)."""
    method._state_kind = "upkeep"  # type: ignore[attr-defined]
    return method


def marked_methods(cls: type, kind: str) -> dict[str, Callable[..., Any]]:
    """``cls``'s public methods marked ``kind`` ("read", "write" or "upkeep"), by name."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    return {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") and getattr(member, "_state_kind", None) == kind
    }


class Repository:
    """One feature's slice of the store, over the store's engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: StoreEngine, *, file: Path | None = None, url: str | None = None):
        self._engine = engine
        #: the SQLite file (None on PostgreSQL), for what reports file sizes
        self._file = file
        #: the store's URL with its password masked (None on SQLite), for what names the store
        self._url = url

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self._engine!r}>"


__all__ = ["KINDS", "Repository", "StoreEngine", "marked_methods", "reads", "upkeep_steps", "writes"]
