"""``AsyncSessionDB``: the store for the asyncio daemon, never blocking the event loop.

Every write goes to ONE writer thread (a single-worker executor: a queue
answering through futures), each in its own ``BEGIN IMMEDIATE``; reads run on
a small pool of reader threads, each with its own connection.  The
coroutines are generated from :class:`state.SessionDB`'s ``@_reads`` /
``@_writes`` marks and call the very same methods, so there is no second
copy of any SQL.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .db import SessionDB, public_methods
from .errors import StateError


def _coroutine(name: str, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: "AsyncSessionDB", *args: Any, **kwargs: Any) -> Any:
        executor = self._writer if kind == "write" else self._readers
        if executor is None:
            raise StateError("the async state store is closed: open a new AsyncSessionDB")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(method, self.db, *args, **kwargs))

    call.__name__ = name
    call.__qualname__ = f"AsyncSessionDB.{name}"
    return call


class AsyncSessionDB:
    """The same public methods as :class:`SessionDB`, as coroutines.

    ``await adb.close()`` waits for queued writes to finish, then closes the
    database.  ``AsyncSessionDB.open(path)`` opens the database on a thread
    (opening may migrate, which must not block the loop either).
    """

    def __init__(self, db: SessionDB, *, readers: int = 3):
        self.db = db
        self._writer: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="state-writer")
        self._readers: ThreadPoolExecutor | None = ThreadPoolExecutor(max(1, readers), thread_name_prefix="state-reader")

    @classmethod
    async def open(cls, db_path: Any = None, *, write_timeout: float = 10.0, readers: int = 3) -> "AsyncSessionDB":
        loop = asyncio.get_running_loop()
        db = await loop.run_in_executor(None, functools.partial(SessionDB, db_path, write_timeout=write_timeout))
        return cls(db, readers=readers)

    @property
    def db_path(self):
        return self.db.db_path

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]:
        if self._writer is None:
            raise StateError("the async state store is closed: open a new AsyncSessionDB")
        return await asyncio.get_running_loop().run_in_executor(self._writer, self.db.checkpoint, mode)

    async def close(self) -> None:
        writer, readers = self._writer, self._readers
        if writer is None:
            return
        self._writer = self._readers = None
        loop = asyncio.get_running_loop()

        def shutdown() -> None:
            writer.shutdown(wait=True)  # queued writes finish first
            readers.shutdown(wait=True)
            self.db.close()

        await loop.run_in_executor(None, shutdown)

    async def __aenter__(self) -> "AsyncSessionDB":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


for _kind in ("read", "write"):
    for _name, _method in public_methods(_kind).items():
        setattr(AsyncSessionDB, _name, _coroutine(_name, _method, _kind))
del _kind, _name, _method

# sanitize_title needs no thread: it touches no database
AsyncSessionDB.sanitize_title = staticmethod(SessionDB.sanitize_title)  # type: ignore[attr-defined]
