"""The connection the store's functions run on with PostgreSQL: psycopg's own, set up for the store's SQL.

The store's SQL is written once, with ``$1, $2, ...`` parameters (``state._sql``), which PostgreSQL
reads itself: :func:`configure` makes every cursor of a connection psycopg's ``RawCursor``, which
sends the text as it is, so nothing is rewritten on the way and a ``%`` is just a ``%``.  Parameters
are bound on the server: a text is sent untyped (PostgreSQL types it by where it stands, as SQLite
does), and a statement a connection has run five times is prepared there.  A parameter whose place
gives it no type (``$1 IS NULL``, a ``CASE`` of parameters alone) is written with its ``CAST``.

What :func:`configure` adds to psycopg's defaults, so that both engines store and return the same:

* a Python ``bool`` is sent as the integer 0 or 1 (the store's flags are integer columns);
* a NUL character in a text, which PostgreSQL's ``text`` cannot hold, is stored as U+FFFD;
* a ``numeric`` (what ``SUM`` of integers gives) comes back as ``int`` when whole, else ``float``;
* rows are :class:`Row`: by index and by column name, as the store's functions read SQLite's rows.

:class:`StoreConnection` is ``psycopg.Connection`` with the dialect the store's functions ask
(``state._dialect.dialect_of``), ``executemany`` on the connection itself, and the count that
lets :meth:`state._pg.PgEngine.read` run a read of one statement without a transaction.
"""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Any, Callable, Iterator, Sequence

import psycopg
from psycopg.adapt import Loader
from psycopg.types.numeric import Int2Dumper
from psycopg.types.string import StrDumperUnknown

from ._dialect import POSTGRES


class Row:
    """A result row: ``row[0]``, ``row["id"]``, ``dict(row)``, ``tuple(row)``, unpacking, ``==`` a tuple."""

    __slots__ = ("_values", "_index")

    def __init__(self, values: tuple, index: dict[str, int]):
        self._values = values
        self._index = index

    def keys(self) -> list[str]:
        return list(self._index)

    def __getitem__(self, key: int | str | slice) -> Any:
        if isinstance(key, str):
            try:
                return self._values[self._index[key]]
            except KeyError:
                raise IndexError(f"no such column: {key}") from None
        return self._values[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Row):
            return self._values == other._values
        return self._values == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._index, self._values, strict=False))!r})"


@functools.lru_cache(maxsize=1024)
def _column_index(names: tuple[bytes | None, ...]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):  # no name: not a result of rows (a COPY's)
        if name is not None:
            index.setdefault(name.decode("utf-8", "replace"), i)
    return index


def row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    """psycopg's row factory for :class:`Row` (column names read from the result itself:
    ``cursor.description`` would make a ``Column`` of each, for every statement)."""
    result = cursor.pgresult
    count = result.nfields if result is not None else 0
    index = _column_index(tuple(result.fname(i) for i in range(count)) if count else ())

    def make(values: Sequence[Any]) -> Row:
        return Row(tuple(values), index)

    return make


class _FlagDumper(Int2Dumper):
    """``True``/``False`` as the integers 1/0 (an ``int2`` PostgreSQL widens to the column's type)."""


class _TextDumper(StrDumperUnknown):
    """A text sent untyped, as psycopg does; a NUL in it (PostgreSQL's ``text`` cannot hold one) as U+FFFD."""

    def dump(self, obj: str) -> Any:
        return super().dump(obj.replace("\x00", "\ufffd") if "\x00" in obj else obj)


class _NumberLoader(Loader):
    """A ``numeric`` as ``int`` when whole, else ``float`` (SQLite's ``SUM`` gives those)."""

    def load(self, data: Any) -> int | float:
        value = Decimal(bytes(data).decode())
        return int(value) if value == value.to_integral_value() else float(value)


def configure(conn: psycopg.Connection) -> None:
    """Set a new connection up for the store's SQL (see the module docstring); the pool's ``configure``."""
    conn.cursor_factory = psycopg.RawCursor
    conn.row_factory = row_factory  # type: ignore[assignment]
    conn.adapters.register_dumper(bool, _FlagDumper)
    conn.adapters.register_dumper(str, _TextDumper)
    conn.adapters.register_loader("numeric", _NumberLoader)


class NotOneStatement(BaseException):
    """A read tried in one statement of its own runs a second: it needs its snapshot (see PgEngine.read).
    A BaseException, so no ``except Exception`` of a store function can swallow it."""


class StoreConnection(psycopg.Connection):
    """psycopg's connection as the store's functions take it (see the module docstring)."""

    dialect = POSTGRES

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._statements_left: int | None = None  # a read run as one statement: None when unlimited

    def alone(self, on: bool) -> None:
        """From now on, until ``alone(False)``: a second statement raises :class:`NotOneStatement`."""
        self._statements_left = 1 if on else None

    def _count(self, statements: int) -> None:
        if self._statements_left is not None:
            self._statements_left -= statements
            if self._statements_left < 0:
                raise NotOneStatement

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool = False) -> Any:
        self._count(1)
        return super().execute(query, params or None, prepare=prepare, binary=binary)

    def executemany(self, query: str, params_seq: Any) -> Any:
        """``cursor.executemany`` on a new cursor of this connection (the store's functions call it here)."""
        rows = list(params_seq)
        self._count(len(rows))
        cursor = self.cursor()
        cursor.executemany(query, rows)
        return cursor

