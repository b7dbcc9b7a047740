"""``AsyncSessionDB``: the store for the asyncio daemon, never blocking the event loop.

Every write goes to ONE writer thread, each in its own ``BEGIN IMMEDIATE``;
reads run on a small pool of reader threads, each with its own connection.
The store's upkeep steps (``@upkeep_steps``) run on a thread of their own
and give way: a write that comes while one runs interrupts it.
A call is a queue in and ``call_soon_threadsafe`` out (:class:`_Workers`):
about 60 µs of CPU, where ``run_in_executor`` took 100 (a turn makes six).  The
coroutines are generated from the ``@reads`` / ``@writes`` marks of
:class:`state.SessionDB`'s repositories (``state._repo``: ``adb.sessions``,
``adb.messages``...) and call the very same methods, so there is no second
copy of any SQL.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import queue
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ._repo import KINDS, Repository, marked_methods
from .db import SessionDB, public_methods
from .errors import StateError

if TYPE_CHECKING:
    # the coroutines added below, at import, as the type checker sees them (generated from SessionDB)
    from ._aio_face import AsyncFace
    from .cluster.store import ClusterStore
else:
    AsyncFace = object


class _Workers:
    """Threads that run calls for coroutines: a queue in, the result handed back with ``call_soon_threadsafe``.

    A call whose caller was cancelled before a thread took it is skipped, as an
    executor's would be.  :meth:`shutdown` (blocking) lets queued calls finish;
    so does interpreter exit, for a store nobody closed.
    """

    _live: "weakref.WeakSet[_Workers]" = weakref.WeakSet()

    def __init__(self, count: int, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()
        _Workers._live.add(self)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((loop, future, fn))
        return future

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            loop, future, fn = call
            if future.cancelled():
                continue
            outcome: tuple[Any, BaseException | None]
            try:
                outcome = (fn(), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                outcome = (None, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def shutdown(self) -> None:
        for _ in self._threads:
            self._calls.put(None)
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@atexit.register
def _finish_queued_calls() -> None:
    for workers in list(_Workers._live):
        workers.shutdown()


def _coroutine(name: str, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: "AsyncSessionDB", *args: Any, **kwargs: Any) -> Any:
        workers = {"write": self._writer, "read": self._readers, "upkeep": self._upkeep}[kind]
        if workers is None:
            raise StateError("the async state store is closed: open a new AsyncSessionDB")
        return await workers.submit(functools.partial(method, self.db, *args, **kwargs))

    call.__name__ = name
    call.__qualname__ = f"AsyncSessionDB.{name}"
    return call


class _AsyncRepository:
    """A repository's marked methods as coroutines, on its store's threads (made per repository
    class by :func:`_async_repository_class`)."""

    def __init__(self, owner: "AsyncSessionDB", repository: Repository):
        self._owner = owner
        self._repository = repository

    def __repr__(self) -> str:
        return f"<async {self._repository!r}>"


def _repository_coroutine(name: str, method: Callable[..., Any], kind: str, cls_name: str) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: _AsyncRepository, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner
        workers = {"write": owner._writer, "read": owner._readers, "upkeep": owner._upkeep}[kind]
        if workers is None:
            raise StateError("the async state store is closed: open a new AsyncSessionDB")
        return await workers.submit(functools.partial(method, self._repository, *args, **kwargs))

    call.__name__ = name
    call.__qualname__ = f"{cls_name}.{name}"
    return call


_ASYNC_CLASSES: dict[type[Repository], type[_AsyncRepository]] = {}


def _async_repository_class(repository: type[Repository]) -> type[_AsyncRepository]:
    if repository in _ASYNC_CLASSES:
        return _ASYNC_CLASSES[repository]
    name = f"Async{repository.__name__}"
    members: dict[str, Any] = {"__doc__": repository.__doc__}
    for kind in KINDS:
        for method_name, method in marked_methods(repository, kind).items():
            members[method_name] = _repository_coroutine(method_name, method, kind, name)
    made = _ASYNC_CLASSES[repository] = type(name, (_AsyncRepository,), members)
    return made


class AsyncSessionDB(AsyncFace):
    """The same repositories as :class:`SessionDB` (``adb.sessions``, ``adb.messages``...), whose
    methods are coroutines here, and SessionDB's own few store-wide methods as coroutines.

    They are made at import from the marks; ``state/_aio_face.pyi`` declares them for the
    type checker (``python -m state._gen_aio_face`` writes it).

    ``await adb.close()`` waits for queued writes to finish, then closes the
    database.  ``AsyncSessionDB.open(path)`` opens the database on a thread
    (opening may migrate, which must not block the loop either).
    """

    def __init__(self, db: SessionDB, *, readers: int = 3):
        self.db = db
        self._writer: _Workers | None = _Workers(1, "state-writer")
        self._readers: _Workers | None = _Workers(max(1, readers), "state-reader")
        # upkeep steps give way to the other writes: on a thread of their own, so that a write
        # coming meanwhile (from the writer thread) reaches the lock and interrupts the step
        self._upkeep: _Workers | None = _Workers(1, "state-upkeep")
        for name in SessionDB.REPOSITORIES:
            repository = getattr(db, name)
            setattr(self, name, _async_repository_class(type(repository))(self, repository))

    @classmethod
    async def open(cls, db_path: Any = None, *, write_timeout: float = 10.0, readers: int = 3) -> "AsyncSessionDB":
        loop = asyncio.get_running_loop()
        db = await loop.run_in_executor(None, functools.partial(SessionDB, db_path, write_timeout=write_timeout))
        return cls(db, readers=readers)

    @property
    def db_path(self) -> Path | None:
        """:attr:`SessionDB.db_path`: the SQLite file, None on PostgreSQL."""
        return self.db.db_path

    @property
    def cluster(self) -> ClusterStore | None:
        """:attr:`SessionDB.cluster`: the cluster's coordination on a PostgreSQL store, None on SQLite.
        Its lease and cron tick calls block: run them on a thread."""
        return self.db.cluster

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        if self._writer is None:
            raise StateError("the async state store is closed: open a new AsyncSessionDB")
        return await self._writer.submit(functools.partial(self.db.checkpoint, mode))

    async def close(self) -> None:
        writer, readers, upkeep = self._writer, self._readers, self._upkeep
        if writer is None or readers is None or upkeep is None:
            return
        self._writer = self._readers = self._upkeep = None
        loop = asyncio.get_running_loop()

        def shutdown() -> None:
            upkeep.shutdown()
            writer.shutdown()  # queued writes finish first
            readers.shutdown()
            self.db.close()

        await loop.run_in_executor(None, shutdown)

    async def __aenter__(self) -> "AsyncSessionDB":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # sanitize_title needs no thread: it touches no database
    sanitize_title = staticmethod(SessionDB.sanitize_title)


for _kind in ("read", "write", "upkeep"):
    for _name, _method in public_methods(_kind).items():
        setattr(AsyncSessionDB, _name, _coroutine(_name, _method, _kind))
del _kind, _name, _method
