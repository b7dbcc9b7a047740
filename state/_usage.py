"""The usage ledger: one row per model call, and its daily roll-ups.

    model_calls           when, for whom (session, platform, chat, user, agent), why (purpose),
                          which model, its tokens, latency and outcome, the price used and the cost
    model_calls_daily     the calls summed per UTC day, model, platform and purpose
    model_calls_daily_by  the calls summed per UTC day and user, and per UTC day and chat
                          (``dim`` 'user' or 'chat', ``key`` 'platform:id')
    model_calls_weekly_by their calls and tokens per week (``week`` the first day's number:
                          a multiple of 7), what ranks thousands of users or chats

Tokens are stored as the endpoint reported them: ``prompt_tokens`` counts every
input token, the cached reads among them too (``cached_tokens``, a part of
``prompt_tokens``, never added to it).  ``estimated`` is 1 when the endpoint
reported no usage and the gateway counted for itself.  The price used (per
million tokens) is stored beside the cost, so a cost can be recomputed; a row
without a price has ``cost`` NULL ("no price").

A row's platform and user come from its session when the caller did not know
them.  The rows of a deleted session go with it (``sessions prune``, the
daemon's retention); :func:`prune_calls` drops rows older than a cutoff
(``usage.keep_days``).

The roll-ups are kept in the transaction that changes the ledger: new rows are
added to them (summed per key here, then one upsert per key and roll-up), rows
about to be deleted subtracted and repriced rows subtracted and added again (in
SQL, from the rows themselves).  A report reads them for every whole UTC day of
its window (a few thousand rows a day where the ledger may hold tens of
thousands), and the ledger itself only for the hours of a window that starts
within a day, and for one user's calls (``/usage``: the ledger's index by user
is the shorter read there).  Not one roll-up per grouping: each costs every new
row an upsert, and day, model, platform and purpose share one at a few hundred
rows a day.  ``--top N`` by user or chat ranks every account by its tokens from
the weekly rows of the window's whole weeks and the daily rows of the few days
before them (a third of the rows the daily ones alone would be), then reads the
N it shows day by day.

**Locks (PostgreSQL, writes at READ COMMITTED).**  The ledger's rows are inserts and its roll-ups
upserts that add to the committed row (``ON CONFLICT ... DO UPDATE SET calls = calls +
excluded.calls``), so two instances recording at once both count.  A reprice subtracts and adds back
in one transaction; two reprices of one model at once are not expected (an operator's command) and
the roll-up can be rebuilt from the ledger.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import sqlite3
from typing import Any

from ._dialect import SQLITE, Dialect, dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered

_EPOCH = dt.date(1970, 1, 1)
DAY = 86_400

# Columns a report can be grouped by; "day" is the UTC date of the call.
GROUPS = {
    "day": SQLITE.day("at"),  # on each engine its dialect's (see _day)
    "model": "model",
    "platform": "COALESCE(platform, '?')",
    "purpose": "purpose",
    "user": "COALESCE(platform, '?') || ':' || COALESCE(user_id, '?')",
    "chat": "COALESCE(platform, '?') || ':' || COALESCE(chat_id, '?')",
}

# What a report sums, per group and day: name, and its SQL over the ledger's rows.  The names are
# the roll-up's columns.  "input_tokens" leave out the cached reads (a part of prompt_tokens).
SUMS = (
    ("calls", "COUNT(*)"),
    ("input_tokens", "SUM(prompt_tokens - cached_tokens)"),
    ("cached_input_tokens", "SUM(cached_tokens)"),
    ("output_tokens", "SUM(completion_tokens)"),
    ("cache_write_tokens", "SUM(cache_write_tokens)"),
    ("cost", "COALESCE(SUM(cost), 0.0)"),
    ("unpriced", "SUM(CASE WHEN cost IS NULL THEN 1 ELSE 0 END)"),
    ("estimated", "SUM(estimated)"),
    ("failed", "SUM(CASE WHEN outcome = 'failed' THEN 1 ELSE 0 END)"),
    ("retried", "SUM(CASE WHEN outcome = 'retried' THEN 1 ELSE 0 END)"),
)
_SUM_NAMES = tuple(name for name, _ in SUMS)


def _day(dialect: Dialect) -> str:
    """The UTC day number of ``at`` (days since 1970)."""
    return dialect.day("at")


def _group(by: str, dialect: Dialect) -> str:
    return _day(dialect) if by == "day" else GROUPS[by]

COLUMNS = ("at", "session_id", "platform", "chat_id", "user_id", "agent", "purpose", "model", "prompt_tokens",
           "completion_tokens", "cached_tokens", "cache_write_tokens", "estimated", "latency_ms", "outcome",
           "error", "attempts", "price_input", "price_output", "price_cached_input", "cost")
_DEFAULTS = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "cache_write_tokens": 0, "estimated": 0,
             "attempts": 1}


#: Schema v20 on both engines (``state._dialect``'s type tokens): the ledger and the indexes its reports
#: use (by time; by session for deletes).
TABLES = (
    """CREATE TABLE IF NOT EXISTS model_calls (
        id {ROWID},
        at {REAL} NOT NULL,
        session_id TEXT,
        platform TEXT,
        chat_id TEXT,
        user_id TEXT,
        agent TEXT,
        purpose TEXT NOT NULL,
        model TEXT NOT NULL,
        prompt_tokens {INTEGER} NOT NULL DEFAULT 0,
        completion_tokens {INTEGER} NOT NULL DEFAULT 0,
        cached_tokens {INTEGER} NOT NULL DEFAULT 0,
        cache_write_tokens {INTEGER} NOT NULL DEFAULT 0,
        estimated {INTEGER} NOT NULL DEFAULT 0,
        latency_ms {REAL},
        outcome TEXT NOT NULL,
        error TEXT,
        attempts {INTEGER} NOT NULL DEFAULT 1,
        price_input {REAL},
        price_output {REAL},
        price_cached_input {REAL},
        cost {REAL}
    )""",
    "CREATE INDEX IF NOT EXISTS idx_model_calls_at ON model_calls(at)",
    "CREATE INDEX IF NOT EXISTS idx_model_calls_session ON model_calls(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_model_calls_user ON model_calls(user_id, at)",
)


def create_tables(conn: sqlite3.Connection) -> None:
    """Schema v20: :data:`TABLES`."""
    dialect_of(conn).create(conn, TABLES)


def create_rollup(conn: Any) -> None:
    """Schema v21 (SQLite and PostgreSQL): the daily roll-ups, filled from the rows already in the ledger."""
    dialect = dialect_of(conn)
    integer, real, rowid = dialect.integer, dialect.real, dialect.without_rowid
    sums = ", ".join(f"{name} {real if name == 'cost' else integer} NOT NULL" for name in _SUM_NAMES)
    conn.execute(f"CREATE TABLE IF NOT EXISTS model_calls_daily (day {integer} NOT NULL, model TEXT NOT NULL, "
                 f"platform TEXT NOT NULL, purpose TEXT NOT NULL, {sums}, "
                 f"PRIMARY KEY (day, model, platform, purpose)){rowid}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS model_calls_daily_by (dim TEXT NOT NULL, day {integer} NOT NULL, "
                 f"key TEXT NOT NULL, {sums}, PRIMARY KEY (dim, day, key)){rowid}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS model_calls_weekly_by (dim TEXT NOT NULL, week {integer} NOT NULL, "
                 f"key TEXT NOT NULL, calls {integer} NOT NULL, tokens {integer} NOT NULL, "
                 f"PRIMARY KEY (dim, week, key)){rowid}")
    rebuild_rollup(conn)


def rebuild_rollup(conn: Any) -> None:
    """Sum the whole ledger into the roll-ups again."""
    conn.execute("DELETE FROM model_calls_daily")
    conn.execute("DELETE FROM model_calls_daily_by")
    conn.execute("DELETE FROM model_calls_weekly_by")
    _roll(conn, "1 = 1", ())


# The grouping each roll-up answers, and the groupings of model_calls_daily's rows by its columns.
_ROLLED_BY = {"user": "model_calls_daily_by", "chat": "model_calls_daily_by"}
_WEEKLY = ("user", "chat")  # model_calls_weekly_by's, for ranking
_CALLS_DAILY_COLUMN = {"day": "day", "model": "model", "platform": "platform", "purpose": "purpose"}


@functools.lru_cache(maxsize=64)
def _roll_sql(where: str, sign: int, dialect: Dialect = SQLITE) -> tuple[str, str, str]:
    """The three statements adding (``sign`` 1) or subtracting (-1) the ledger's rows matching ``where``."""
    day = _day(dialect)
    sums = ", ".join(sql if sign > 0 else f"-{sql}" for _, sql in SUMS)
    names = ", ".join(_SUM_NAMES)
    calls = (f"INSERT INTO model_calls_daily (day, model, platform, purpose, {names}) "
             f"SELECT {day}, model, {GROUPS['platform']}, purpose, {sums} FROM model_calls "
             f"WHERE {where} GROUP BY 1, 2, 3, 4 "
             f"ON CONFLICT (day, model, platform, purpose) DO UPDATE SET {_added('model_calls_daily', _SUM_NAMES)}")
    dims = "(SELECT 'user' AS dim UNION ALL SELECT 'chat') AS d"
    key = f"CASE d.dim WHEN 'user' THEN {GROUPS['user']} ELSE {GROUPS['chat']} END"
    people = (f"INSERT INTO model_calls_daily_by (dim, day, key, {names}) "
              f"SELECT d.dim, {day}, {key}, {sums} FROM model_calls, {dims} "
              f"WHERE {where} GROUP BY 1, 2, 3 "
              f"ON CONFLICT (dim, day, key) DO UPDATE SET {_added('model_calls_daily_by', _SUM_NAMES)}")
    minus = "" if sign > 0 else "-"
    weekly = (f"INSERT INTO model_calls_weekly_by (dim, week, key, calls, tokens) "
              f"SELECT d.dim, {day} - {day} % 7, {key}, {minus}COUNT(*), {minus}SUM(prompt_tokens + completion_tokens) "
              f"FROM model_calls, {dims} WHERE {where} GROUP BY 1, 2, 3 "
              f"ON CONFLICT (dim, week, key) DO UPDATE SET {_added('model_calls_weekly_by', ('calls', 'tokens'))}")
    return calls, people, weekly


def _added(table: str, names: tuple[str, ...]) -> str:
    """An upsert's SET: each column plus the new row's (the table named: PostgreSQL sees two rows)."""
    return ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in names)


def _roll(conn: Any, where: str, params: tuple | list, sign: int = 1) -> None:
    """Add (``sign`` 1) or subtract (-1) the ledger's rows matching ``where`` to or from the roll-ups."""
    for sql in _roll_sql(where, sign, dialect_of(conn)):
        conn.execute(sql, params)


def _unroll(conn: Any, where: str, params: tuple | list) -> None:
    """Subtract the rows matching ``where`` (about to be deleted) from the roll-ups; drop what is left empty."""
    days = [row[0] for row in conn.execute(
        f"SELECT DISTINCT {_day(dialect_of(conn))} FROM model_calls WHERE {where}", params)]
    if not days:
        return
    _roll(conn, where, params, sign=-1)
    weeks = sorted({day - day % 7 for day in days})
    for i in range(0, len(days), 500):
        chunk = days[i:i + 500]
        marks = numbered(len(chunk))
        conn.execute(f"DELETE FROM model_calls_daily WHERE day IN ({marks}) AND calls <= 0", chunk)
        conn.execute(f"DELETE FROM model_calls_daily_by WHERE dim IN ('user', 'chat') AND day IN ({marks}) "
                     "AND calls <= 0", chunk)
    for i in range(0, len(weeks), 500):
        chunk = weeks[i:i + 500]
        conn.execute(f"DELETE FROM model_calls_weekly_by WHERE dim IN ('user', 'chat') "
                     f"AND week IN ({numbered(len(chunk))}) AND calls <= 0", chunk)


def _values(conn: sqlite3.Connection, row: dict) -> list:
    """The row's values in :data:`COLUMNS` order; a missing platform or user is taken from its session."""
    values = {name: row[name] if row.get(name) is not None else _DEFAULTS.get(name) for name in COLUMNS}
    if values["session_id"] and (values["platform"] is None or values["user_id"] is None):
        found = conn.execute("SELECT source, user_id FROM sessions WHERE id = $1", (values["session_id"],)).fetchone()
        if found is not None:
            values["platform"] = values["platform"] or found[0]
            values["user_id"] = values["user_id"] or found[1]
    return [values[name] for name in COLUMNS]


_INSERT = f"INSERT INTO model_calls ({', '.join(COLUMNS)})"  # insert_ids adds the VALUES


def record_call(conn: sqlite3.Connection, row: dict) -> int:
    """Add one call (and it to the roll-ups); a missing platform or user is taken from the call's session."""
    return record_calls(conn, [row])[0]


def record_calls(conn: sqlite3.Connection, rows: list[dict]) -> list[int]:
    """Add calls, and them to the roll-ups; their ids."""
    if not rows:
        return []
    values = [_values(conn, row) for row in rows]
    ids = dialect_of(conn).insert_ids(conn, _INSERT, values)
    _add_new(conn, values)
    return ids


_AT, _PLATFORM, _CHAT, _USER, _PURPOSE, _MODEL, _PROMPT, _COMPLETION, _CACHED, _CACHE_WRITE, _ESTIMATED, _OUTCOME, \
    _COST = (COLUMNS.index(name) for name in ("at", "platform", "chat_id", "user_id", "purpose", "model",
                                              "prompt_tokens", "completion_tokens", "cached_tokens",
                                              "cache_write_tokens", "estimated", "outcome", "cost"))


def _upsert(table: str, keys: tuple[str, ...], names: tuple[str, ...]) -> tuple[str, str]:
    """An upsert that adds to a roll-up's row, as :meth:`state._dialect.Dialect.insert_rows`' head and tail."""
    return (f"INSERT INTO {table} ({', '.join(keys + names)})",
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {_added(table, names)}")


_UPSERT_CALLS = _upsert("model_calls_daily", ("day", "model", "platform", "purpose"), _SUM_NAMES)
_UPSERT_BY = _upsert("model_calls_daily_by", ("dim", "day", "key"), _SUM_NAMES)
_UPSERT_WEEKLY = _upsert("model_calls_weekly_by", ("dim", "week", "key"), ("calls", "tokens"))


def _add_new(conn: sqlite3.Connection, values: list[list]) -> None:
    """Add new rows (their values in COLUMNS order, as inserted) to the roll-ups, summed here per key:
    a third of the CPU of summing them in SQL for the one or few rows a write usually holds.  The keys
    and sums are :data:`GROUPS`' and :data:`SUMS`' (the roll-up test holds them to the same answers)."""
    calls: dict[tuple, list] = {}
    people: dict[tuple, list] = {}
    weekly: dict[tuple, list] = {}
    for v in values:
        day = int(v[_AT] // DAY)
        platform = "?" if v[_PLATFORM] is None else v[_PLATFORM]
        cost = v[_COST]
        sums = [1, v[_PROMPT] - v[_CACHED], v[_CACHED], v[_COMPLETION], v[_CACHE_WRITE],
                0.0 if cost is None else cost, int(cost is None), int(v[_ESTIMATED]),
                int(v[_OUTCOME] == "failed"), int(v[_OUTCOME] == "retried")]
        user = f"{platform}:{'?' if v[_USER] is None else v[_USER]}"
        chat = f"{platform}:{'?' if v[_CHAT] is None else v[_CHAT]}"
        for key, table in (((day, v[_MODEL], platform, v[_PURPOSE]), calls), (("user", day, user), people),
                           (("chat", day, chat), people)):
            known = table.get(key)
            if known is None:
                table[key] = list(sums)
            else:
                for i, value in enumerate(sums):
                    known[i] += value
        tokens = v[_PROMPT] + v[_COMPLETION]
        for key in (("user", day - day % 7, user), ("chat", day - day % 7, chat)):
            known = weekly.get(key)
            if known is None:
                weekly[key] = [1, tokens]
            else:
                known[0] += 1
                known[1] += tokens
    # one statement per roll-up (rows in key order: two writers lock shared rows in one order)
    dialect = dialect_of(conn)
    for (head, tail), sums_by_key in ((_UPSERT_CALLS, calls), (_UPSERT_BY, people), (_UPSERT_WEEKLY, weekly)):
        dialect.insert_rows(conn, head, tail, [(*key, *sums_by_key[key]) for key in sorted(sums_by_key, key=_key_order)])


def _key_order(key: tuple) -> tuple[str, ...]:
    """One order for a roll-up's keys (a model may be None), the same in every writer."""
    return tuple("" if part is None else str(part) for part in key)


def list_calls(conn: sqlite3.Connection, since: float, limit: int = 1000) -> list[dict]:
    """The calls since ``since``, oldest first."""
    cur = conn.execute(f"SELECT id, {', '.join(COLUMNS)} FROM model_calls WHERE at >= $1 ORDER BY at, id LIMIT $2",
                       (since, limit))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur]


def _source(conn: sqlite3.Connection, since: float, by: str, platform: str | None, user_id: str | None,
            keys: list | None = None) -> tuple[str, list]:
    """SQL for the window's rows as (grp, day, *SUMS), and its parameters; a group may have several
    rows a day (they add up).  ``keys``: only these groups' rows are wanted (the caller still filters:
    this only lets the per-user and per-chat roll-up be read by its key instead of whole days)."""
    if by not in GROUPS:
        raise ValueError(f"cannot group usage by {by!r}; choose one of {', '.join(GROUPS)}")
    sums = ", ".join(f"{sql} AS {name}" for name, sql in SUMS)
    dialect = dialect_of(conn)
    raw = f"SELECT {_group(by, dialect)} AS grp, {_day(dialect)} AS day, {sums} FROM model_calls WHERE "
    if user_id is not None:  # one user's: their calls, by the ledger's index on the user
        return (raw + "at >= $1 AND (platform = $2 OR (platform IS NULL AND CAST($3 AS TEXT) IS NULL)) "
                "AND user_id = $4 GROUP BY grp, day", [since, platform, platform, user_id])
    first = math.ceil(since / DAY)  # the first whole day: the roll-ups'; the hours before it, the ledger's
    names = ", ".join(_SUM_NAMES)
    if by in _ROLLED_BY and keys is not None:  # each day of each key, looked up
        # two queries: each is one step down the primary key, where MIN and MAX together read every row
        low = conn.execute(f"SELECT MIN(day) FROM {_ROLLED_BY[by]} WHERE dim = $1", (by,)).fetchone()[0]
        high = conn.execute(f"SELECT MAX(day) FROM {_ROLLED_BY[by]} WHERE dim = $1", (by,)).fetchone()[0]
        days = list(range(max(first, low), high + 1)) if low is not None else []
        p = Params(by)
        sql = (f"SELECT key AS grp, day, {names} FROM {_ROLLED_BY[by]} WHERE dim = $1 "
               f"AND day IN ({p.each(days) or 'NULL'}) AND key IN ({p.each(keys) or 'NULL'})")
    elif by in _ROLLED_BY:
        sql, p = f"SELECT key AS grp, day, {names} FROM {_ROLLED_BY[by]} WHERE dim = $1 AND day >= $2", Params(by, first)
    else:
        sql, p = (f"SELECT {_CALLS_DAILY_COLUMN[by]} AS grp, day, {names} FROM model_calls_daily WHERE day >= $1",
                  Params(first))
    if first * DAY > since:
        sql += f" UNION ALL {raw} at >= {p(since)} AND at < {p(first * DAY)} GROUP BY grp, day"
    return sql, p.values


def _ranking(since: float, by: str, source: str, params: list, dialect: Dialect) -> tuple[str, list]:
    """SQL for rows as (grp, tokens) that add up per group to the window's tokens: for users and
    chats, the weekly rows of the weeks that start in the window (every day of theirs is in it: the
    window runs on to now) and the daily rows of the days before the first of them, plus the ledger's
    rows of a first partial day; for the rest, the window's rows."""
    tokens = "input_tokens + cached_input_tokens + output_tokens"
    if by not in _WEEKLY:
        return f"SELECT grp, {tokens} AS tokens FROM ({source}) AS src", params
    first = math.ceil(since / DAY)
    week = first + (-first) % 7  # the first week (days since 1970 that are multiples of 7) starting in the window
    sql = ("SELECT key AS grp, tokens FROM model_calls_weekly_by WHERE dim = $1 AND week >= $2 UNION ALL "
           f"SELECT key AS grp, {tokens} FROM model_calls_daily_by WHERE dim = $3 AND day >= $4 AND day < $5")
    p = Params(by, week, by, first, week)
    if first * DAY > since:
        sql += (f" UNION ALL SELECT {_group(by, dialect)} AS grp, prompt_tokens + completion_tokens FROM model_calls "
                f"WHERE at >= {p(since)} AND at < {p(first * DAY)}")
    return sql, p.values


def _dates(days: set[int]) -> dict[int, str]:
    """Each UTC day (days since 1970-01-01) as ``YYYY-MM-DD``."""
    return {day: (_EPOCH + dt.timedelta(days=day)).isoformat() for day in days}


def usage_report(conn: sqlite3.Connection, since: float, by: str, *, platform: str | None = None,
                 user_id: str | None = None) -> list[dict]:
    """Totals per group and UTC day (``YYYY-MM-DD``) since ``since``: one dict per (group, day).

    ``platform`` and ``user_id`` together keep one user's calls only."""
    source, params = _source(conn, since, by, platform, user_id)
    sums = ", ".join(f"SUM({name}) AS {name}" for name in _SUM_NAMES)
    cur = conn.execute(f"SELECT grp, day, {sums} FROM ({source}) AS src GROUP BY grp, day", params)
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in cur]
    dates = _dates({row["day"] for row in rows})
    for row in rows:
        row["day"] = dates[row["day"]]
        if by == "day":
            row["grp"] = row["day"]
    return rows


def usage_summary(conn: sqlite3.Connection, since: float, by: str, *, limit: int | None = None,
                  platform: str | None = None, user_id: str | None = None) -> dict:
    """The figures of :func:`usage_report` summed per group, with each group's tokens per day::

        {"groups": [{"grp": ..., "calls": ..., <SUMS>}, ...],     # any order
         "daily": [(grp, "YYYY-MM-DD", input + cached input + output tokens), ...],
         "total": {"calls": ..., <SUMS>},                          # every group's
         "total_daily": [("YYYY-MM-DD", tokens), ...],
         "count": how many groups there are}

    A group may have several daily entries for a day: they add up.  With ``limit``, only the
    ``limit`` groups with the most tokens (ties: by name) are given (``count`` still counts them all):
    thousands of users or chats are ranked by one sum, and only the ones shown summed in full."""
    source, params = _source(conn, since, by, platform, user_id)
    days, day_params = _source(conn, since, "day", platform, user_id)  # every call once: the total's source
    sums = ", ".join(f"SUM({name}) AS {name}" for name in _SUM_NAMES)
    tokens = "input_tokens + cached_input_tokens + output_tokens"
    cur = conn.execute(f"SELECT {sums} FROM ({days}) AS src", day_params)
    total = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    total_daily = conn.execute(f"SELECT day, SUM({tokens}) FROM ({days}) AS src GROUP BY day", day_params).fetchall()
    where, chosen = "", []
    if limit is None:
        count = None
    else:
        ranking, ranking_params = _ranking(since, by if user_id is None else "", source, params, dialect_of(conn))
        ranked = conn.execute(f"SELECT grp, SUM(tokens) AS tokens FROM ({ranking}) AS src GROUP BY grp",
                              ranking_params).fetchall()
        count = len(ranked)
        ranked.sort(key=lambda r: (-(r[1] or 0), str(r[0])))
        chosen = [grp for grp, _ in ranked[:limit]]
        source, params = _source(conn, since, by, platform, user_id, keys=chosen)
        where = f" WHERE grp IN ({numbered(len(chosen), len(params) + 1)})"  # after the source's parameters
    if limit is not None and not chosen:
        groups, daily = [], []
    else:
        cur = conn.execute(f"SELECT grp, {sums} FROM ({source}) AS src{where} GROUP BY grp", params + chosen)
        names = [d[0] for d in cur.description]
        groups = [dict(zip(names, r, strict=True)) for r in cur]
        daily = conn.execute(f"SELECT grp, day, {tokens} FROM ({source}) AS src{where}", params + chosen).fetchall()
    dates = _dates({day for _, day, _ in daily} | {day for day, _ in total_daily}
                   | ({g["grp"] for g in groups} if by == "day" else set()))
    if by == "day":
        for group in groups:
            group["grp"] = dates[group["grp"]]
        daily = [(dates[grp], dates[day], tokens) for grp, day, tokens in daily]
    else:
        daily = [(grp, dates[day], tokens) for grp, day, tokens in daily]
    return {"groups": groups, "daily": daily, "total": total,
            "total_daily": [(dates[day], tokens) for day, tokens in total_daily],
            "count": len(groups) if count is None else count}


def reprice_calls(conn: sqlite3.Connection, model: str, price: dict[str, float] | None, since: float = 0.0,
                  until: float | None = None) -> int:
    """Recompute the cost of ``model``'s calls from ``since`` to before ``until`` (None: on) with ``price``
    (None: no price); how many."""
    p = Params(model, since)
    where = "model = $1 AND at >= $2"
    if until is not None:
        where += f" AND at < {p(until)}"
    params = p.values
    _roll(conn, where, params, sign=-1)
    if price is None:
        count = conn.execute("UPDATE model_calls SET price_input = NULL, price_output = NULL, "
                             f"price_cached_input = NULL, cost = NULL WHERE {where}", params).rowcount
    else:
        cached = price.get("cached_input", price["input"])
        q = Params(*params)  # the prices' numbers after the window's
        count = conn.execute(
            f"UPDATE model_calls SET price_input = {q(price['input'])}, price_output = {q(price['output'])}, "
            f"price_cached_input = {q(cached)}, cost = ((prompt_tokens - cached_tokens) * {q(price['input'])} "
            f"+ cached_tokens * {q(cached)} + completion_tokens * {q(price['output'])}) / 1e6 WHERE {where}",
            q.values).rowcount
    _roll(conn, where, params)
    return count


def called_models(conn: sqlite3.Connection, since: float = 0.0) -> dict[str, float]:
    """The models the ledger has calls of since ``since``, each with the time of its first (by name)."""
    return dict(conn.execute("SELECT model, MIN(at) FROM model_calls WHERE at >= $1 GROUP BY model ORDER BY model",
                             (since,)).fetchall())


def forget_sessions(conn: sqlite3.Connection, marks: str, chunk: list[str]) -> None:
    """Part of deleting sessions: their calls go with them (and from the roll-up)."""
    where = f"session_id IN ({marks})"
    _unroll(conn, where, chunk)
    conn.execute(f"DELETE FROM model_calls WHERE {where}", chunk)


def prune_calls(conn: sqlite3.Connection, before: float, limit: int | None = None) -> int:
    """Delete the calls made before ``before`` (and from the roll-ups), the oldest ``limit`` of them
    when given (a bounded write: the caller repeats until fewer go); how many."""
    if limit is None:
        where, params = "at < $1", [before]
    else:
        where, params = "id IN (SELECT id FROM model_calls WHERE at < $1 ORDER BY at LIMIT $2)", [before, limit]
    _unroll(conn, where, params)
    return conn.execute(f"DELETE FROM model_calls WHERE {where}", params).rowcount


class UsageLedger(Repository):
    """``db.usage``: the usage ledger, one row per model call, and its reports."""

    @writes
    def record_call(self, row: dict) -> int:
        """Add one model call to the ledger (keys: :data:`state._usage.COLUMNS`); its id."""
        return self._engine.write(record_call, dict(row))

    @writes
    def record_calls(self, rows: list[dict]) -> list[int]:
        """Add several model calls in one transaction; their ids."""
        return self._engine.write(record_calls, [dict(r) for r in rows])

    @reads
    def calls(self, since: float = 0.0, limit: int = 1000) -> list[dict]:
        """The ledger's rows since ``since``, oldest first."""
        return self._engine.read(list_calls, since, limit)

    @reads
    def report(self, since: float, by: str = "day", *, platform: str | None = None,
               user_id: str | None = None) -> list[dict]:
        """Totals per group (day, model, platform, purpose, user, chat) and UTC day since ``since``;
        with ``user_id`` (and its ``platform``) one user's calls only."""
        return self._engine.read(usage_report, since, by, platform=platform, user_id=user_id)

    @reads
    def summary(self, since: float, by: str = "day", *, limit: int | None = None,
                platform: str | None = None, user_id: str | None = None) -> dict:
        """``usage_report``'s figures summed per group, with each group's tokens per day and the total;
        with ``limit``, the ``limit`` groups with the most tokens only (see
        :func:`state._usage.usage_summary`): what ``switchboard insights`` shows."""
        return self._engine.read(usage_summary, since, by, limit=limit, platform=platform,
                                 user_id=user_id)

    @reads
    def called_models(self, since: float = 0.0) -> dict[str, float]:
        """The models the ledger has calls of since ``since``, each with the time of its first."""
        return self._engine.read(called_models, since)

    @writes
    def reprice(self, model: str, price: dict[str, float] | None, since: float = 0.0,
                until: float | None = None) -> int:
        """Recompute the cost of ``model``'s calls from ``since`` to before ``until`` (None: on) with ``price``
        ({input, output, cached_input} per million; None: no price); how many.  One transaction: a
        large ledger is repriced a day at a time (``switchboard insights reprice``)."""
        return self._engine.write(reprice_calls, model, price, since, until)

    @writes
    def prune(self, before: float, limit: int | None = None) -> int:
        """Delete the ledger's rows older than ``before``, the oldest ``limit`` of them when given; how many."""
        return self._engine.write(prune_calls, before, limit)
