"""The usage ledger's daily roll-ups give every report exactly what the ledger's rows give, after new
rows, deleted sessions, `sessions prune`, `usage.keep_days` pruning and a reprice; a v20 store gets
them filled from its ledger when it is opened."""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from collections import defaultdict

import pytest

from state import SessionDB

DAY = 86_400
NOW = 1_780_000_000.0 + 13 * 3_600  # a fixed time in the afternoon (UTC), so windows start mid-ledger
GROUPINGS = ("day", "model", "platform", "purpose", "user", "chat")
MODELS = ("gpt-4o", "gpt-4o-mini", "local")
PRICE = {"input": 2.0, "output": 8.0, "cached_input": 0.5}


def expected(rows: list[dict], since: float, by: str) -> dict[tuple[str, str], dict]:
    """The report worked out here from the ledger's rows, one (group, UTC date) at a time."""
    out: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        if r["at"] < since:
            continue
        day = dt.datetime.fromtimestamp(r["at"], dt.timezone.utc).date().isoformat()
        platform = r["platform"] or "?"
        group = {"day": day, "model": r["model"], "platform": platform, "purpose": r["purpose"],
                 "user": f"{platform}:{r['user_id'] or '?'}", "chat": f"{platform}:{r['chat_id'] or '?'}"}[by]
        t = out[(group, day)]
        t["calls"] += 1
        t["input_tokens"] += r["prompt_tokens"] - r["cached_tokens"]
        t["cached_input_tokens"] += r["cached_tokens"]
        t["output_tokens"] += r["completion_tokens"]
        t["cache_write_tokens"] += r["cache_write_tokens"]
        t["cost"] += r["cost"] or 0.0
        t["unpriced"] += r["cost"] is None
        t["estimated"] += r["estimated"]
        t["failed"] += r["outcome"] == "failed"
        t["retried"] += r["outcome"] == "retried"
    return {key: dict(t) for key, t in out.items()}


def reported(db: SessionDB, since: float, by: str) -> dict[tuple[str, str], dict]:
    return {(row.pop("grp"), row.pop("day")): row for row in db.usage.report(since, by)}


def assert_reports_match_the_ledger(db: SessionDB) -> None:
    rows = db.usage.calls(limit=1_000_000)
    for since in (0.0, NOW - 30 * DAY, NOW - 7 * DAY - 5 * 3_600, (NOW // DAY - 6) * DAY):
        for by in GROUPINGS:
            want, got = expected(rows, since, by), reported(db, since, by)
            assert set(got) == set(want), (since, by)
            for key, totals in want.items():
                assert got[key] == pytest.approx(totals, rel=1e-9, abs=1e-12), (since, by, key)
            summary = db.usage.summary(since, by)
            per_group: dict[str, dict] = defaultdict(lambda: defaultdict(float))
            for (group, _), totals in want.items():
                for name, value in totals.items():
                    per_group[group][name] += value
            groups = {g.pop("grp"): g for g in summary["groups"]}
            assert set(groups) == set(per_group), (since, by)
            for group, totals in per_group.items():
                assert groups[group] == pytest.approx(dict(totals), rel=1e-9, abs=1e-12), (since, by, group)
            daily: dict[tuple[str, str], int] = defaultdict(int)
            for group, day, tokens in summary["daily"]:
                daily[(group, day)] += tokens
            assert daily == {key: t["input_tokens"] + t["cached_input_tokens"] + t["output_tokens"]
                             for key, t in want.items()}, (since, by)
            # --top: the biggest groups by tokens (ties by name), each with its whole totals
            ranked = sorted(per_group, key=lambda g: (-(per_group[g]["input_tokens"] + per_group[g]["cached_input_tokens"]
                                                         + per_group[g]["output_tokens"]), g))
            for limit in (1, 3):
                top = db.usage.summary(since, by, limit=limit)
                assert top["count"] == len(per_group), (since, by, limit)
                assert sorted(g["grp"] for g in top["groups"]) == sorted(ranked[:limit]), (since, by, limit)
                for g in top["groups"]:
                    name = g.pop("grp")
                    assert g == pytest.approx(dict(per_group[name]), rel=1e-9, abs=1e-12), (since, by, name)


def ledger_rows(rng: random.Random, count: int, sessions: list[str]) -> list[dict]:
    rows = []
    for _ in range(count):
        prompt = rng.randint(0, 5_000)
        priced = rng.random() < 0.8
        session = rng.choice(sessions + [None])
        rows.append({
            "at": NOW - rng.random() * 40 * DAY, "session_id": session,
            # a call made for a session may leave its platform and user to the session
            "platform": None if session and rng.random() < 0.3 else rng.choice(["telegram", "slack", None]),
            "chat_id": rng.choice(["c1", "c2", "c3", None]), "user_id": rng.choice(["u1", "u2", None]),
            "agent": "main", "purpose": rng.choice(["turn", "tool_loop", "compression", "cron"]),
            "model": rng.choice(MODELS), "prompt_tokens": prompt, "completion_tokens": rng.randint(0, 900),
            "cached_tokens": rng.randint(0, prompt), "cache_write_tokens": rng.randint(0, 50),
            "estimated": int(rng.random() < 0.1), "latency_ms": 10.0,
            "outcome": rng.choice(["ok", "ok", "retried", "failed"]),
            "price_input": 1.0 if priced else None, "price_output": 2.0 if priced else None,
            "price_cached_input": 0.25 if priced else None,
            "cost": rng.random() / 100 if priced else None,
        })
    return rows


@pytest.mark.slow  # 7 s measured under load: `make test-fast` leaves it out
def test_reports_from_the_roll_ups_equal_the_ledgers_rows_through_every_change(store_target):
    rng = random.Random(7)
    with SessionDB(store_target) as db:
        sessions = [db.sessions.create(f"s{i}", ["telegram", "discord", "api"][i % 3], user_id=f"su{i % 4}")
                    for i in range(12)]
        rows = ledger_rows(rng, 1_500, sessions)
        db.usage.record_calls(rows[:1_000])
        for row in rows[1_000:1_100]:
            db.usage.record_call(row)
        db.usage.record_calls(rows[1_100:])
        assert_reports_match_the_ledger(db)
        before = len(db.usage.calls(limit=1_000_000))

        assert db.sessions.delete(sessions[0])  # `sessions delete`: its calls go with it
        db.sessions.end(sessions[1], "reset")
        db.sessions.end(sessions[2], "reset")
        assert db.sessions.prune(older_than_days=0) == 2  # `sessions prune`, the daemon's retention
        left = db.usage.calls(limit=1_000_000)
        assert 0 < len(left) < before and not {r["session_id"] for r in left} & set(sessions[:3])
        assert_reports_match_the_ledger(db)

        cutoff = NOW - 25.5 * DAY  # usage.keep_days: a cutoff within a day, 40 rows per transaction
        assert db.usage.prune(before=cutoff, limit=40) == 40
        assert_reports_match_the_ledger(db)
        while db.usage.prune(before=cutoff, limit=40) == 40:
            pass
        assert min(r["at"] for r in db.usage.calls(limit=1_000_000)) >= cutoff
        assert_reports_match_the_ledger(db)

        assert db.usage.reprice("gpt-4o", PRICE) > 0
        assert db.usage.reprice("local", None, since=NOW - 10 * DAY) > 0  # a price taken away
        assert db.usage.reprice("gpt-4o-mini", PRICE, since=NOW - 12 * DAY, until=NOW - 11.5 * DAY) > 0
        assert_reports_match_the_ledger(db)

        db.usage.record_calls(ledger_rows(rng, 200, sessions[3:]))  # new rows on the changed roll-ups
        assert_reports_match_the_ledger(db)

        assert db.usage.prune(before=NOW + DAY) > 0  # everything
        assert db.usage.report(0.0, "chat") == []
        empty = db.usage.summary(0.0, "model")
        assert (empty["groups"], empty["daily"], empty["total_daily"], empty["count"]) == ([], [], [], 0)


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
def test_a_store_from_before_the_roll_ups_gets_them_filled_from_its_ledger(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.usage.record_calls(ledger_rows(random.Random(3), 300, []))
        before = reported(db, NOW - 30 * DAY, "user")
    with sqlite3.connect(path) as conn:  # back to schema v20: the ledger without its roll-ups
        conn.execute("DROP TABLE model_calls_daily")
        conn.execute("DROP TABLE model_calls_daily_by")
        conn.execute("UPDATE schema_version SET version = 20")
    with SessionDB(path) as db:
        after = reported(db, NOW - 30 * DAY, "user")
        assert set(after) == set(before) and all(after[k] == pytest.approx(before[k]) for k in before)
        assert_reports_match_the_ledger(db)
