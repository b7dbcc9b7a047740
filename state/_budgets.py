"""Spend budgets: what each scope spent in each period, the rules set from the CLI, and the notices sent.

    budget_spend    (scope, period) -> cost, tokens, calls: a roll-up of the usage ledger kept per
                    budget scope (``user:alice``, ``chat:telegram:42``, ``platform:slack``,
                    ``cron:digest``, ``gateway``) and local period (``d:2026-11-27``, ``m:2026-11``)
    budget_rules    rules set with ``switchboard budgets set`` (they override the config's of the
                    same name until set again)
    budget_notices  (rule, period, level, target): who was told what, once per period
    budget_reservations  what admitted calls still running (or not yet in the ledger) hold back,
                    per (scope, period): written in the transaction that admits a call on a shared
                    store (PostgreSQL), deleted in the one that writes its ledger row
    budget_resets   (scope, period) -> when ``switchboard budgets reset`` last forgot its spend: how
                    every instance learns of a reset it did not make

Why a roll-up of its own: the ledger's (``state._usage``) are per UTC day and per account, while a
budget runs over a day or month in the configured timezone and over an identity's linked accounts.
The gateway names the scopes and periods of each call (:mod:`gateway.budgets`); this module only
adds them up.  :func:`record_calls` writes the ledger's rows and adds them here in the same
transaction, so a check that reads :func:`spent` sees every call the ledger holds, on every instance.

**Locks (PostgreSQL, writes at READ COMMITTED).**  The spends are added by upserts (``cost = cost +
excluded.cost``), atomic on their row; the admission locks its keys' rows in key order
(:func:`admit`); a reset, a rule and a notice are each one statement or ``ON CONFLICT``.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, Callable, Iterable

from . import _usage
from ._dialect import dialect_of
from ._repo import Repository, reads, writes
from ._sql import Params, numbered

#: Schema v25, written once for both engines (``state._dialect``'s type tokens).
TABLES = (
    """CREATE TABLE IF NOT EXISTS budget_spend (
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        cost {REAL} NOT NULL,
        tokens {INTEGER} NOT NULL,
        calls {INTEGER} NOT NULL,
        PRIMARY KEY (scope, period)
    ){WITHOUT_ROWID}""",
    """CREATE TABLE IF NOT EXISTS budget_rules (
        name TEXT NOT NULL PRIMARY KEY,
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        kind TEXT NOT NULL,
        amount {REAL},
        updated_at {REAL} NOT NULL
    ){WITHOUT_ROWID}""",
    "CREATE INDEX IF NOT EXISTS idx_budget_rules_updated ON budget_rules(updated_at)",
    """CREATE TABLE IF NOT EXISTS budget_notices (
        rule TEXT NOT NULL,
        period TEXT NOT NULL,
        level TEXT NOT NULL,
        target TEXT NOT NULL,
        at {REAL} NOT NULL,
        PRIMARY KEY (rule, period, level, target)
    ){WITHOUT_ROWID}""",
)

#: Schema v31, both engines: the reservations of calls admitted on a shared store, and the resets.
TABLES_V31 = (
    """CREATE TABLE IF NOT EXISTS budget_reservations (
        id {SERIAL},
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        cost {REAL} NOT NULL,
        tokens {INTEGER} NOT NULL,
        at {REAL} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_budget_reservations_key ON budget_reservations(scope, period)",
    """CREATE TABLE IF NOT EXISTS budget_resets (
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        at {REAL} NOT NULL,
        PRIMARY KEY (scope, period)
    ){WITHOUT_ROWID}""",
    "CREATE INDEX IF NOT EXISTS idx_budget_resets_at ON budget_resets(at)",
)

#: A reservation older than this is a crashed instance's: no longer counted, and pruned.
RESERVATION_SECONDS = 900.0

#: one spend: (scope, period, cost, tokens)
Spend = tuple[str, str, float, int]

#: An upsert adding to spends, as :meth:`state._dialect.Dialect.insert_rows`' head and tail.
_ADD = ("INSERT INTO budget_spend (scope, period, cost, tokens, calls)",
        "ON CONFLICT (scope, period) DO UPDATE SET cost = budget_spend.cost + excluded.cost, "
        "tokens = budget_spend.tokens + excluded.tokens, calls = budget_spend.calls + excluded.calls")


def create_tables(conn: Any) -> None:
    dialect_of(conn).create(conn, TABLES)


def create_v31(conn: Any) -> None:
    """Schema v31: :data:`TABLES_V31`."""
    dialect_of(conn).create(conn, TABLES_V31)


def add_spends(conn: Any, spends: Iterable[Spend]) -> None:
    """Add spends to the roll-up, summed per (scope, period) first: one upsert per key."""
    summed: dict[tuple[str, str], list] = {}
    for scope, period, cost, tokens in spends:
        known = summed.setdefault((scope, period), [0.0, 0, 0])
        known[0] += cost
        known[1] += tokens
        known[2] += 1
    # one statement, in key order: an admission locks its keys in that order too (no deadlock between them)
    dialect_of(conn).insert_rows(conn, *_ADD, [(scope, period, *summed[(scope, period)]) for scope, period in sorted(summed)])


def record_calls(conn: sqlite3.Connection, rows: list[dict], spends: list[Spend],
                 released: Iterable[int] = ()) -> list[int]:
    """The ledger's rows (and its roll-ups) and the budgets' spends, in one transaction, with the
    reservations of the calls they are (``released``) deleted in it: a call counts as reserved until
    it counts as spent, never as neither; the rows' ids."""
    ids = _usage.record_calls(conn, rows)
    add_spends(conn, spends)
    release(conn, released)
    return ids


def release(conn: Any, ids: Iterable[int]) -> None:
    """Delete reservations (their calls' spends are written, or the calls were never made)."""
    ids = list(ids)
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        conn.execute(f"DELETE FROM budget_reservations WHERE id IN ({numbered(len(chunk))})", chunk)


#: What :func:`admit` is told of the keys: (spent, reserved), each {(scope, period): (cost, tokens)}; it
#: answers what to reserve per key ({key: (cost, tokens)}), or None to reserve nothing (refused).
Judge = Callable[[dict[tuple[str, str], tuple[float, int]], dict[tuple[str, str], tuple[float, int]]],
                 "dict[tuple[str, str], tuple[float, int]] | None"]


def admit(conn: Any, keys: list[tuple[str, str]], judge: Judge, *, now: float) -> tuple[
        dict[tuple[str, str], tuple[float, int]], dict[tuple[str, str], tuple[float, int]], list[int]]:
    """One admission on a shared store, in one transaction: the keys' spend rows locked (in key order),
    what every instance spent and still reserves on them read, ``judge`` asked, and what it says to
    reserve written before the locks go.  Two instances admitting on one key take turns, and each
    sees the other's reservation: (spent, reserved, the new reservations' ids)."""
    keys = sorted(set(keys))
    if not keys:
        return {}, {}, []
    # one statement: each key's row made if new and locked (the upsert's no-op update takes the row's
    # lock, in key order, and waits for an admission holding it), and what it holds returned
    p = Params()
    rows = conn.execute("INSERT INTO budget_spend (scope, period, cost, tokens, calls) VALUES "
                        f"{', '.join(f'({p.each(key)}, 0, 0, 0)' for key in keys)} ON CONFLICT (scope, period) "
                        "DO UPDATE SET calls = budget_spend.calls RETURNING scope, period, cost, tokens",
                        p.values).fetchall()
    spent = {(s, p): (float(c), int(t)) for s, p, c, t in rows}
    scopes, periods = sorted({s for s, _ in keys}), sorted({p for _, p in keys})
    wanted = set(keys)
    q = Params()
    reserved = {(s, p): (float(c), int(t)) for s, p, c, t in conn.execute(
        f"SELECT scope, period, SUM(cost), SUM(tokens) FROM budget_reservations WHERE scope IN "
        f"({q.each(scopes)}) AND period IN ({q.each(periods)}) AND at >= {q(now - RESERVATION_SECONDS)} "
        "GROUP BY scope, period", q.values).fetchall() if (s, p) in wanted}
    holds = judge(spent, reserved)
    if not holds:
        return spent, reserved, []
    held = sorted(holds.items())
    p = Params()
    ids = [int(row[0]) for row in conn.execute(
        "INSERT INTO budget_reservations (scope, period, cost, tokens, at) VALUES "
        f"{', '.join(f'({p.each((scope, period, cost, tokens, now))})' for (scope, period), (cost, tokens) in held)} "
        "RETURNING id", p.values).fetchall()]
    return spent, reserved, ids


def spent(conn: sqlite3.Connection, scopes: list[str], periods: list[str]) -> dict[tuple[str, str], tuple[float, int]]:
    """What each of ``scopes`` spent in each of ``periods`` (absent: nothing): one read down the key."""
    if not scopes or not periods:
        return {}
    q = Params()
    sql = (f"SELECT scope, period, cost, tokens FROM budget_spend WHERE scope IN ({q.each(scopes)}) "
           f"AND period IN ({q.each(periods)})")
    return {(s, p): (c, t) for s, p, c, t in conn.execute(sql, q.values)}


def spent_in(conn: sqlite3.Connection, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, int]]:
    """:func:`spent` for many (scope, period) pairs (a listing of every rule), in chunks."""
    found: dict[tuple[str, str], tuple[float, int]] = {}
    by_period: dict[str, list[str]] = {}
    for scope, period in pairs:
        by_period.setdefault(period, []).append(scope)
    for period, scopes in by_period.items():
        for i in range(0, len(scopes), 500):
            found.update(spent(conn, scopes[i:i + 500], [period]))
    return found


def ledger_spent(conn: sqlite3.Connection, filters: list[tuple[str | None, str | None, str | None]], since: float,
                 until: float) -> tuple[float, int]:
    """(cost, tokens) of the usage ledger's rows from ``since`` to before ``until`` that match any of
    ``filters`` ((platform, user_id, chat_id), None: any): what the ledger still holds of a scope's spend."""
    clauses: list[str] = []
    p = Params(since, until)
    for platform, user_id, chat_id in filters:
        parts = [f"{column} = {p(value)}" for column, value in (("platform", platform), ("user_id", user_id),
                                                              ("chat_id", chat_id)) if value is not None]
        clauses.append(" AND ".join(parts) or "1 = 1")
    where = " OR ".join(f"({c})" for c in clauses) or "1 = 0"
    cost, tokens = conn.execute("SELECT COALESCE(SUM(cost), 0.0), COALESCE(SUM(prompt_tokens + completion_tokens), 0) "
                                f"FROM model_calls WHERE at >= $1 AND at < $2 AND ({where})", p.values).fetchone()
    return float(cost), int(tokens)


def reset_spend(conn: sqlite3.Connection, scope: str, period: str, now: float | None = None) -> bool:
    """Forget what ``scope`` spent in ``period`` (the ledger keeps its rows); whether there was any.
    The period's notices go too, so the next 80 % is told again; the reset is marked (``budget_resets``)
    for the instances that keep the spends in memory."""
    gone = conn.execute("DELETE FROM budget_spend WHERE scope = $1 AND period = $2", (scope, period)).rowcount
    conn.execute("DELETE FROM budget_notices WHERE period = $1 AND rule LIKE $2", (period, f"{scope}/%"))
    conn.execute("INSERT INTO budget_resets (scope, period, at) VALUES ($1, $2, $3) "
                 "ON CONFLICT (scope, period) DO UPDATE SET at = excluded.at",
                 (scope, period, time.time() if now is None else now))
    return gone > 0


def resets_since(conn: sqlite3.Connection, since: float) -> list[tuple[str, str, float]]:
    """The (scope, period, at) reset after ``since``, oldest first."""
    return [(s, p, float(a)) for s, p, a in conn.execute(
        "SELECT scope, period, at FROM budget_resets WHERE at > $1 ORDER BY at", (since,)).fetchall()]


def set_rule(conn: sqlite3.Connection, name: str, scope: str, period: str, kind: str, amount: float | None, *,
             now: float) -> None:
    """Store a rule (``amount`` None: the rule is off, overriding the config's of the same name)."""
    conn.execute("INSERT INTO budget_rules (name, scope, period, kind, amount, updated_at) VALUES ($1, $2, $3, $4, $5, $6) "
                 "ON CONFLICT (name) DO UPDATE SET scope = excluded.scope, period = excluded.period, "
                 "kind = excluded.kind, amount = excluded.amount, updated_at = excluded.updated_at",
                 (name, scope, period, kind, amount, now))


def stored_rules(conn: sqlite3.Connection, since: float = -1.0) -> list[dict]:
    """The rules set from the CLI and changed after ``since``, oldest change first."""
    cur = conn.execute("SELECT name, scope, period, kind, amount, updated_at FROM budget_rules WHERE updated_at > $1 "
                       "ORDER BY updated_at, name", (since,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def changes_since(conn: sqlite3.Connection, rules_since: float,
                  resets_since: float) -> tuple[list[dict], list[tuple[str, str, float]]]:
    """:func:`stored_rules` changed after ``rules_since`` and :func:`resets_since` after ``resets_since``,
    each in its order, read in one statement (what a budget gate's refresh reads every round)."""
    rules: list[dict] = []
    resets: list[tuple[str, str, float]] = []
    for what, name, scope, period, kind, amount, at in conn.execute(
            "SELECT 'rule', name, scope, period, kind, amount, updated_at FROM budget_rules WHERE updated_at > $1 "
            "UNION ALL SELECT 'reset', NULL, scope, period, NULL, NULL, at FROM budget_resets WHERE at > $2 "
            "ORDER BY 1, 7, 2", (rules_since, resets_since)).fetchall():
        if what == "rule":
            rules.append({"name": name, "scope": scope, "period": period, "kind": kind, "amount": amount,
                          "updated_at": at})
        else:
            resets.append((scope, period, float(at)))
    return rules, resets


def claim_notice(conn: sqlite3.Connection, rule: str, period: str, level: str, target: str, *, now: float) -> bool:
    """Whether this is the first time ``target`` is told ``level`` about ``rule`` in ``period`` (then
    it is marked told): once across instances and restarts."""
    return conn.execute("INSERT INTO budget_notices (rule, period, level, target, at) VALUES ($1, $2, $3, $4, $5) "
                        "ON CONFLICT (rule, period, level, target) DO NOTHING",
                        (rule, period, level, target, now)).rowcount > 0


def prune_spend(conn: sqlite3.Connection, before_day: str, before_month: str) -> int:
    """Drop the spend and notice rows of the days before ``before_day`` (``d:YYYY-MM-DD``) and the
    months before ``before_month`` (``m:YYYY-MM``): no rule reads them again; how many spend rows."""
    gone = 0
    for table in ("budget_spend", "budget_notices"):
        count = conn.execute(f"DELETE FROM {table} WHERE (period LIKE 'd:%' AND period < $1) "
                             "OR (period LIKE 'm:%' AND period < $2)", (before_day, before_month)).rowcount
        gone += count if table == "budget_spend" else 0
    conn.execute("DELETE FROM budget_resets WHERE (period LIKE 'd:%' AND period < $1) "
                 "OR (period LIKE 'm:%' AND period < $2)", (before_day, before_month))
    conn.execute("DELETE FROM budget_reservations WHERE at < $1", (time.time() - RESERVATION_SECONDS,))
    return gone


class Budgets(Repository):
    """``db.budgets``: the spend roll-up per budget scope and period, the rules set from the CLI, notices."""

    @writes
    def record_calls(self, rows: list[dict], spends: list[tuple[str, str, float, int]],
                     released: list[int] | None = None) -> list[int]:
        """Add model calls to the usage ledger and their spends to the budgets', and delete the
        reservations ``released``, in one transaction."""
        return self._engine.write(record_calls, [dict(r) for r in rows], list(spends), list(released or ()))

    @writes
    def admit(self, keys: list[tuple[str, str]], judge: Callable[..., Any], *, now: float) -> tuple[
            dict[tuple[str, str], tuple[float, int]], dict[tuple[str, str], tuple[float, int]], list[int]]:
        """Decide on a call against what every instance spent and reserves on ``keys``, and reserve
        what ``judge`` says, in one transaction (see :func:`admit`).  On PostgreSQL at READ COMMITTED
        with the keys' rows locked: the lock is what orders admissions, not a serialization failure."""
        run = getattr(self._engine, "write_committed", None) or self._engine.write
        return run(admit, list(keys), judge, now=now)

    @writes
    def release(self, ids: list[int]) -> None:
        """Delete reservations (calls that were never recorded)."""
        return self._engine.write(release, list(ids))

    @reads
    def resets(self, since: float) -> list[tuple[str, str, float]]:
        """The (scope, period, at) reset after ``since``."""
        return self._engine.read(resets_since, since)

    @reads
    def spent(self, scopes: list[str], periods: list[str]) -> dict[tuple[str, str], tuple[float, int]]:
        """(cost, tokens) spent per (scope, period); a pair that spent nothing is absent."""
        return self._engine.read(spent, list(scopes), list(periods))

    @reads
    def spent_in(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, int]]:
        """(cost, tokens) spent per (scope, period) pair asked for; a pair that spent nothing is absent."""
        return self._engine.read(spent_in, list(pairs))

    @reads
    def ledger_spent(self, filters: list[tuple[str | None, str | None, str | None]], since: float,
                     until: float) -> tuple[float, int]:
        """(cost, tokens) the usage ledger still holds of a scope's spend (see :func:`ledger_spent`)."""
        return self._engine.read(ledger_spent, [tuple(f) for f in filters], since, until)

    @writes
    def reset(self, scope: str, period: str, *, now: float | None = None) -> bool:
        """Forget what ``scope`` spent in ``period``; whether it had spent anything."""
        return self._engine.write(reset_spend, scope, period, now)

    @writes
    def set_rule(self, name: str, scope: str, period: str, kind: str, amount: float | None, *, now: float) -> None:
        """Store a rule set from the CLI or dashboard (``amount`` None: turned off)."""
        return self._engine.write(set_rule, name, scope, period, kind, amount, now=now)

    @reads
    def rules(self, since: float = -1.0) -> list[dict]:
        """The stored rules changed after ``since``."""
        return self._engine.read(stored_rules, since)

    @reads
    def changes(self, rules_since: float, resets_since: float) -> tuple[list[dict], list[tuple[str, str, float]]]:
        """:meth:`rules` changed after ``rules_since`` and :meth:`resets` after ``resets_since``, in one read."""
        return self._engine.read(changes_since, rules_since, resets_since)

    @writes
    def claim_notice(self, rule: str, period: str, level: str, target: str, *, now: float) -> bool:
        """Whether ``target`` is told ``level`` about ``rule`` for the first time this ``period``."""
        return self._engine.write(claim_notice, rule, period, level, target, now=now)

    @writes
    def prune(self, before_day: str, before_month: str) -> int:
        """Drop the spends of the days before ``before_day`` and the months before ``before_month``."""
        return self._engine.write(prune_spend, before_day, before_month)
