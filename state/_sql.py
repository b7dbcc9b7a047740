"""The store's SQL parameters: ``$1``, ``$2``, ... on both engines, read by each engine itself.

PostgreSQL reads ``$n`` as its own numbered parameters (psycopg's ``RawCursor`` sends the text as it
is), and SQLite reads ``$1`` as a parameter named ``1``, bound by number from the values in order
(``state._engine``).  So a statement is written once, in the text both engines run, and no SQL is
rewritten at run time.  A number may stand more than once in a statement (``$1`` twice is one value).

A statement whose parameters depend on its input (a filter that may or may not apply, an ``IN`` list
of any length) is composed with :class:`Params`, which hands out the next number with each value::

    p = Params(platform)
    where = ["platform = $1"]
    if ids:
        where.append(f"user_id IN ({p.each(ids)})")
    conn.execute(f"SELECT ... WHERE {' AND '.join(where)} LIMIT {p(limit)}", p.values)
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Any, Iterable


class Params:
    """A composed statement's values, in order; calling it with a value gives that value's ``$n``."""

    __slots__ = ("values",)

    def __init__(self, *first: Any):
        self.values: list[Any] = list(first)  # the values already written as $1 ... $len(first)

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"

    def each(self, values: Iterable[Any]) -> str:
        """``$k, $k+1, ...``, one for each of ``values`` (for an ``IN (...)`` list or a row's values)."""
        return ", ".join([self(v) for v in values])


@functools.lru_cache(maxsize=512)
def numbered(count: int, start: int = 1) -> str:
    """``$start, ..., $(start + count - 1)``: the parameters of a row of ``count`` values."""
    return ", ".join([f"${i}" for i in range(start, start + count)])


# --- SQLite: the numbers bound by name ------------------------------------------------------------

#: ``"1"``, ``"2"``, ...: the names SQLite gives ``$1``, ``$2``, ... (sqlite3 looks a name up without its ``$``).
_NAMES = tuple(str(i) for i in range(1, 32767))


def by_number(params: Any) -> Any:
    """``params`` (a sequence of values for ``$1 ... $n``) as sqlite3 binds named parameters."""
    if params and not isinstance(params, dict):  # a tuple, a list, a row of another statement
        return dict(zip(_NAMES, params, strict=False))  # _NAMES is the longer
    return params


class NumberedCursor(sqlite3.Cursor):
    """sqlite3's own cursor, its ``$n`` parameters bound by number (see the module docstring)."""

    def execute(self, sql: str, parameters: Any = (), /) -> NumberedCursor:
        return super().execute(sql, by_number(parameters))

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> NumberedCursor:
        return super().executemany(sql, (by_number(row) for row in seq_of_parameters))


class NumberedConnection(sqlite3.Connection):
    """sqlite3's own connection (``sqlite3.connect(..., factory=NumberedConnection)``), its ``$n``
    parameters bound by number, in its statements and its cursors'."""

    def cursor(self, factory: Any = NumberedCursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return super().execute(sql, by_number(parameters))

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        return super().executemany(sql, (by_number(row) for row in parameters))
