"""Spend budgets: what each scope spent in each period, the rules set from the CLI, and the notices sent.

    budget_spend    (scope, period) -> cost, tokens, calls: a roll-up of the usage ledger kept per
                    budget scope (``user:alice``, ``chat:telegram:42``, ``platform:slack``,
                    ``cron:digest``, ``gateway``) and local period (``d:2026-11-27``, ``m:2026-11``)
    budget_rules    rules set with ``switchboard budgets set`` (they override the config's of the
                    same name until set again)
    budget_notices  (rule, period, level, target): who was told what, once per period

Why a roll-up of its own: the ledger's (``state._usage``) are per UTC day and per account, while a
budget runs over a day or month in the configured timezone and over an identity's linked accounts.
The gateway names the scopes and periods of each call (:mod:`gateway.budgets`); this module only
adds them up.  :func:`record_calls` writes the ledger's rows and adds them here in the same
transaction, so a check that reads :func:`spent` sees every call the ledger holds, on every instance.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable

from . import _usage
from ._dialect import dialect_of
from ._repo import Repository, reads, writes

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

#: one spend: (scope, period, cost, tokens)
Spend = tuple[str, str, float, int]

_ADD = ("INSERT INTO budget_spend (scope, period, cost, tokens, calls) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (scope, period) DO UPDATE SET cost = budget_spend.cost + excluded.cost, "
        "tokens = budget_spend.tokens + excluded.tokens, calls = budget_spend.calls + excluded.calls")


def create_tables(conn: Any) -> None:
    dialect_of(conn).create(conn, TABLES)


def add_spends(conn: Any, spends: Iterable[Spend]) -> None:
    """Add spends to the roll-up, summed per (scope, period) first: one upsert per key."""
    summed: dict[tuple[str, str], list] = {}
    for scope, period, cost, tokens in spends:
        known = summed.setdefault((scope, period), [0.0, 0, 0])
        known[0] += cost
        known[1] += tokens
        known[2] += 1
    if summed:
        conn.executemany(_ADD, [(scope, period, *sums) for (scope, period), sums in summed.items()])


def record_calls(conn: sqlite3.Connection, rows: list[dict], spends: list[Spend]) -> list[int]:
    """The ledger's rows (and its roll-ups) and the budgets' spends, in one transaction; the rows' ids."""
    ids = _usage.record_calls(conn, rows)
    add_spends(conn, spends)
    return ids


def spent(conn: sqlite3.Connection, scopes: list[str], periods: list[str]) -> dict[tuple[str, str], tuple[float, int]]:
    """What each of ``scopes`` spent in each of ``periods`` (absent: nothing): one read down the key."""
    if not scopes or not periods:
        return {}
    sql = (f"SELECT scope, period, cost, tokens FROM budget_spend WHERE scope IN ({', '.join('?' * len(scopes))}) "
           f"AND period IN ({', '.join('?' * len(periods))})")
    return {(s, p): (c, t) for s, p, c, t in conn.execute(sql, [*scopes, *periods])}


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


def reset_spend(conn: sqlite3.Connection, scope: str, period: str) -> bool:
    """Forget what ``scope`` spent in ``period`` (the ledger keeps its rows); whether there was any.
    The period's notices go too, so the next 80 % is told again."""
    gone = conn.execute("DELETE FROM budget_spend WHERE scope = ? AND period = ?", (scope, period)).rowcount
    conn.execute("DELETE FROM budget_notices WHERE period = ? AND rule LIKE ?", (period, f"{scope}/%"))
    return gone > 0


def set_rule(conn: sqlite3.Connection, name: str, scope: str, period: str, kind: str, amount: float | None, *,
             now: float) -> None:
    """Store a rule (``amount`` None: the rule is off, overriding the config's of the same name)."""
    conn.execute("INSERT INTO budget_rules (name, scope, period, kind, amount, updated_at) VALUES (?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT (name) DO UPDATE SET scope = excluded.scope, period = excluded.period, "
                 "kind = excluded.kind, amount = excluded.amount, updated_at = excluded.updated_at",
                 (name, scope, period, kind, amount, now))


def stored_rules(conn: sqlite3.Connection, since: float = -1.0) -> list[dict]:
    """The rules set from the CLI and changed after ``since``, oldest change first."""
    cur = conn.execute("SELECT name, scope, period, kind, amount, updated_at FROM budget_rules WHERE updated_at > ? "
                       "ORDER BY updated_at, name", (since,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def claim_notice(conn: sqlite3.Connection, rule: str, period: str, level: str, target: str, *, now: float) -> bool:
    """Whether this is the first time ``target`` is told ``level`` about ``rule`` in ``period`` (then
    it is marked told): once across instances and restarts."""
    return conn.execute("INSERT INTO budget_notices (rule, period, level, target, at) VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT (rule, period, level, target) DO NOTHING",
                        (rule, period, level, target, now)).rowcount > 0


def prune_spend(conn: sqlite3.Connection, before_day: str, before_month: str) -> int:
    """Drop the spend and notice rows of the days before ``before_day`` (``d:YYYY-MM-DD``) and the
    months before ``before_month`` (``m:YYYY-MM``): no rule reads them again; how many spend rows."""
    gone = 0
    for table in ("budget_spend", "budget_notices"):
        count = conn.execute(f"DELETE FROM {table} WHERE (period LIKE 'd:%' AND period < ?) "
                             "OR (period LIKE 'm:%' AND period < ?)", (before_day, before_month)).rowcount
        gone += count if table == "budget_spend" else 0
    return gone


class Budgets(Repository):
    """``db.budgets``: the spend roll-up per budget scope and period, the rules set from the CLI, notices."""

    @writes
    def record_calls(self, rows: list[dict], spends: list[tuple[str, str, float, int]]) -> list[int]:
        """Add model calls to the usage ledger and their spends to the budgets', in one transaction."""
        return self._engine.write(record_calls, [dict(r) for r in rows], list(spends))

    @reads
    def spent(self, scopes: list[str], periods: list[str]) -> dict[tuple[str, str], tuple[float, int]]:
        """(cost, tokens) spent per (scope, period); a pair that spent nothing is absent."""
        return self._engine.read(spent, list(scopes), list(periods))

    @reads
    def spent_in(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, int]]:
        """(cost, tokens) spent per (scope, period) pair asked for; a pair that spent nothing is absent."""
        return self._engine.read(spent_in, list(pairs))

    @writes
    def reset(self, scope: str, period: str) -> bool:
        """Forget what ``scope`` spent in ``period``; whether it had spent anything."""
        return self._engine.write(reset_spend, scope, period)

    @writes
    def set_rule(self, name: str, scope: str, period: str, kind: str, amount: float | None, *, now: float) -> None:
        """Store a rule set from the CLI or dashboard (``amount`` None: turned off)."""
        return self._engine.write(set_rule, name, scope, period, kind, amount, now=now)

    @reads
    def rules(self, since: float = -1.0) -> list[dict]:
        """The stored rules changed after ``since``."""
        return self._engine.read(stored_rules, since)

    @writes
    def claim_notice(self, rule: str, period: str, level: str, target: str, *, now: float) -> bool:
        """Whether ``target`` is told ``level`` about ``rule`` for the first time this ``period``."""
        return self._engine.write(claim_notice, rule, period, level, target, now=now)

    @writes
    def prune(self, before_day: str, before_month: str) -> int:
        """Drop the spends of the days before ``before_day`` and the months before ``before_month``."""
        return self._engine.write(prune_spend, before_day, before_month)
