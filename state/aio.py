"""``AsyncSessionDB``: the store for the asyncio daemon, never blocking the event loop.

Every write goes to a writer thread, each in its own transaction: on SQLite ONE writer thread
(``BEGIN IMMEDIATE``: SQLite writes one at a time anyway); on PostgreSQL :data:`PG_WRITERS`, each on
a connection of the pool, side by side (serializable transactions, retried on a conflict, as the
cluster's instances already write the same sessions side by side).  A write goes to the writer its
session picks (``session_id``, else its first argument when that is text), so one session's writes
submitted one after another still commit in that order;
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
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from ._repo import KINDS, Repository, marked_methods
from .db import SessionDB, public_methods
from .errors import StateError, StoreCorrupt

if TYPE_CHECKING:
    # the coroutines added below, at import, as the type checker sees them (generated from SessionDB)
    from ._aio_face import AsyncFace
    from .cluster.store import ClusterStore
else:
    AsyncFace = object


#: Writer threads on PostgreSQL, each on a connection of the store's pool (8: these, the readers, upkeep).
#: Two: chosen when the store's write transactions were SERIALIZABLE and two sessions' writes running side
#: by side failed each other's now and then (predicate locks on the small tables' index pages), so more
#: writers cost more retries than they brought.  Writes now run at READ COMMITTED with row locks
#: (state._pg); whether more writers pay now is yet to be measured (bench/cluster.py --via api).
PG_WRITERS = 2


class _Workers:
    """Threads that run calls for coroutines: a queue in, the result handed back with ``call_soon_threadsafe``.

    A call whose caller was cancelled before a thread took it is skipped, as an
    executor's would be.  :meth:`shutdown` (blocking) lets queued calls finish;
    so does interpreter exit, for a store nobody closed.
    """

    _live: "weakref.WeakSet[_Workers]" = weakref.WeakSet()

    def __init__(self, count: int, name: str, *, keyed: bool = False):
        # keyed: a queue per thread, a call goes to the thread its key picks (calls with one key run in
        # the order submitted; calls with no key all go to the first, one after another); otherwise one
        # queue that every thread takes from
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count if keyed else 1)]
        self._threads = [threading.Thread(target=self._serve, args=(self._queues[i % len(self._queues)],),
                                          name=f"{name}_{i}", daemon=True) for i in range(count)]
        for thread in self._threads:
            thread.start()
        _Workers._live.add(self)

    def submit(self, fn: Callable[[], Any], key: str | None = None) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        queues = self._queues
        pick = 0 if key is None or len(queues) == 1 else zlib.crc32(key.encode()) % len(queues)
        queues[pick].put((loop, future, fn))
        return future

    def _serve(self, calls: queue.SimpleQueue) -> None:
        while True:
            call = calls.get()
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
        for i in range(len(self._threads)):
            self._queues[i % len(self._queues)].put(None)
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


_write_observer: Callable[[str], ContextManager[Any]] | None = None


def observe_writes(observer: Callable[[str], ContextManager[Any]] | None) -> None:
    """Run every write coroutine inside ``observer(method_name)`` (a tracing span); None: stop."""
    global _write_observer
    _write_observer = observer


def _write_key(args: tuple, kwargs: dict) -> str | None:
    """What a write is about, for the writer it goes to: its ``session_id``, else its first argument when
    that is text (a session's id or key, a delivery's id).  None (the usage ledger, whose daily roll-up
    rows every turn adds to, and other writes of no one session): the first writer, so such writes
    still take turns as with one writer instead of failing each other's serializable transactions."""
    key = kwargs.get("session_id")
    if isinstance(key, str):
        return key
    return args[0] if args and isinstance(args[0], str) else None


async def _run(owner: "AsyncSessionDB", kind: str, label: str, call: Callable[[], Any],
               args: tuple, kwargs: dict) -> Any:
    """``call()`` on the store's threads for ``kind``: a write on the writer its session picks (inside the
    write observer, a tracing span, when one is set), a read on a reader, an upkeep step on its own."""
    workers = {"write": owner._writer, "read": owner._readers, "upkeep": owner._upkeep}[kind]
    if workers is None:
        raise StateError("the async state store is closed: open a new AsyncSessionDB")
    if kind != "write":
        return await workers.submit(call)
    key = _write_key(args, kwargs)
    if _write_observer is not None:
        with _write_observer(label):
            return await workers.submit(call, key)
    return await workers.submit(call, key)


def _coroutine(name: str, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: "AsyncSessionDB", *args: Any, **kwargs: Any) -> Any:
        return await _run(self, kind, name, functools.partial(method, self.db, *args, **kwargs), args, kwargs)

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
    label = f"{cls_name.removeprefix('Async')}.{name}"  # Messages.record_turn

    @functools.wraps(method)
    async def call(self: _AsyncRepository, *args: Any, **kwargs: Any) -> Any:
        return await _run(self._owner, kind, label, functools.partial(method, self._repository, *args, **kwargs),
                          args, kwargs)

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

    def __init__(self, db: SessionDB, *, readers: int = 3, writers: int | None = None):
        self.db = db
        # SQLite has one writer at a time anyway; PostgreSQL's serializable transactions run side by side
        writers = writers if writers is not None else (1 if db.db_path is not None else PG_WRITERS)
        self._writer: _Workers | None = _Workers(max(1, writers), "state-writer", keyed=True)
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

    def refuse_writes(self, problems: list[str]) -> StoreCorrupt:
        """:meth:`SessionDB.refuse_writes` (no I/O: safe on the event loop)."""
        return self.db.refuse_writes(problems)

    @property
    def writes_refused(self) -> StoreCorrupt | None:
        return self.db.writes_refused

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
