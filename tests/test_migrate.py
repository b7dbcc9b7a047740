"""`switchboard migrate --to postgresql://...`: a SQLite home's whole store copied into PostgreSQL
(every table, ids kept), checked, and refused while anything is using either side."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

import state
from gateway.cli.main import main
from gateway.runtime import lockfile
from state import migrate as store_migrate

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_700_000_000.0
#: Tables SQLite's schema has only to match PostgreSQL's (the cluster's leases, tick claims and rate budgets): empty there.
UNUSED_ON_SQLITE = {"work_leases", "cron_ticks", "rate_buckets"}


def _fill_every_table(home: Path) -> Path:
    """A home whose store has rows in every table, through the store's own API."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = home / "state.db"
    with state.SessionDB(path) as db:
        db.sessions.create("root", "telegram", model="m", user_id="u1")
        db.sessions.create("child", "telegram", model="m", user_id="u1", parent_session_id="root")
        db.sessions.create("other", "cli", model="m")
        db.routes.set("telegram:dm:u1", "child")
        stalled = db.messages.append_inbound("child", "the kubernetes rollout stalled overnight", platform_message_id="tg:1",
                                    inbox={"session_key": "telegram:dm:u1", "platform": "telegram", "chat_id": "c1",
                                           "chat_type": "dm", "user_id": "u1"})
        db.media.attach(stalled.id, [{"sha256": "ab" * 32, "name": "rollout.log", "mime": "text/plain", "size": 9,
                                      "kind": "document", "text": "rollout stalled at 3/5 pods"}])
        db.messages.append("root", "assistant", "restart the deployment with a canary")
        db.messages.append("root", "assistant", None, tool_calls=[{"id": "t1", "type": "function", "function": {
            "name": "shell", "arguments": json.dumps({"cmd": "kubectl rollout undo"})}}])
        db.messages.append("other", "user", "记忆系统 的设计 notes about zeppelins")
        for i in range(30):
            db.messages.append("other", "user", f"filler message number {i} about gardening")
        db.recovery.begin_streamed_delivery(state.DeliveryRecord("d1", "telegram", "c1"), session_id="child",
                                   sent_ids=["m1"])
        db.receipts.record("telegram", "m1", "delivered", at=NOW)
        db.dead_letters.add(platform="telegram", event_id="e1", payload="{}", message=None, error="boom")
        db.usage.record_call({"at": NOW, "session_id": "root", "purpose": "turn", "model": "m", "outcome": "ok",
                              "prompt_tokens": 10, "completion_tokens": 5})
        db.facts.add("agent", "u1", "prefers canary deploys", ["deploy"], session_id="root", trust=0.5, now=NOW,
                    hrr=b"\x00\x01\x02vector")
        db.facts.claim_extraction("root", now=NOW)
        db.facts.set_prefetch("telegram:dm:u1", True, now=NOW)
        db.prefs.set("telegram:dm:u1", "stream", "off", now=NOW)
        db.budgets.record_calls([{"at": NOW, "session_id": "root", "purpose": "turn", "model": "m", "outcome": "ok",
                                  "prompt_tokens": 3, "completion_tokens": 2}], [("user:alice", "d:2026-01-01", 0.5, 5)])
        db.budgets.set_rule("user:alice/day/cost", "user:alice", "day", "cost", 2.0, now=NOW)
        db.budgets.claim_notice("user:alice/day/cost", "d:2026-01-01", "80", "telegram:dm:u1", now=NOW)
        db.budgets.admit([("user:alice", "d:2026-01-01")], lambda spent, reserved: {("user:alice", "d:2026-01-01"):
                                                                                   (0.25, 3)}, now=NOW)
        db.budgets.reset("user:bob", "d:2026-01-01", now=NOW)
        db.approvals.add({"id": "0a1b2c3d", "session_id": "root", "session_key": "telegram:dm:u1",
                          "platform": "telegram", "chat_type": "dm", "chat_id": "c1", "user_id": "u1",
                          "tool": "files__write", "arguments": '{"path":"a"}', "call_hash": "ab" * 32,
                          "tool_call_id": "t1", "policy": "always", "requested_at": NOW, "expires_at": NOW + 600})
        db.questions.add({"id": "q1w2e3r4", "session_id": "root", "session_key": "telegram:dm:u1",
                          "platform": "telegram", "chat_id": "c1", "user_id": "u1", "tool": "trips__book",
                          "field": "city", "kind": "choice", "choices": '[["rome","Rome"]]', "asked_at": NOW,
                          "expires_at": NOW + 600})
        db.a2a.add({"id": "task-1", "caller": "planner", "context_id": "ctx-1",
                    "session_key": "agent:main:a2a:planner:ctx-1", "request": "hello", "created_at": NOW})
        assert db.replays.claim("webhook:n8n", "sha256=ab12", keep_until=NOW + 600, held_until=NOW + 30,
                                now=NOW) == "taken"
        db.mcp_auth.put("docs", "telegram:u1", "tokens", "sealed-tokens", expires_at=NOW + 3600, now=NOW)
        db.mcp_auth.add_flow({"state_hash": "ab" * 32, "server": "docs", "principal": "telegram:u1",
                              "platform": "telegram", "chat_id": "c1", "data": "sealed-flow", "created_at": NOW,
                              "expires_at": NOW + 900})
        db.pairing.request("telegram", "u2", "Bea", "CODE1", now=time.time(), ttl=3600, max_pending=3)
        db.pairing.request("telegram", "u3", "Cy", "CODE2", now=time.time(), ttl=3600, max_pending=3)
        db.pairing.approve("telegram", "CODE2")
        db.cron.add_job({"id": "j", "name": "J", "schedule": "every 1h", "prompt": "p", "deliver": "local",
                         "model": None, "context": "fresh", "grace_seconds": 3600.0},
                        source="cli", now=NOW, next_run_at=NOW + 3600)
        db.cron.begin_run("j", holder="h", now=NOW, lease_seconds=60, trigger="manual", scheduled_at=None,
                          deliver="local")
        db.upkeep.record({"finished_at": NOW, "sessions_pruned": 0})
        db.tool_journal.save(1, "root", "[]", "call-1", now=NOW)
        db.sessions.create("early", "api")
        db.sessions.create("late", "api")
    with sqlite3.connect(path) as conn:  # a parent stored after its child: copied first all the same
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("UPDATE sessions SET parent_session_id = 'late' WHERE id = 'early'")
    return path


def _cli(*args: str):
    return CliRunner().invoke(main, ["migrate", *args], catch_exceptions=False)


def _count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]


def _rows(where: Path | str, table: str) -> list[tuple]:
    """Every row of ``table``, sorted, its columns by name: the same on both sides after a copy."""
    if isinstance(where, Path):
        with sqlite3.connect(where) as conn:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
    else:
        with psycopg.connect(where) as conn:
            cursor = conn.execute(f'SELECT * FROM "{table}"')
            names = [d.name for d in cursor.description]
            rows = cursor.fetchall()
    return sorted((tuple(sorted(zip(names, row, strict=True))) for row in rows), key=repr)


def _copied_tables(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return store_migrate._source_tables(conn)[0]
    finally:
        conn.close()


def test_every_table_is_copied_with_its_ids_and_search_finds_the_same(tmp_path, pg_url):
    home = tmp_path / "home"
    path = _fill_every_table(home)
    tables = _copied_tables(path)
    with sqlite3.connect(path) as conn:
        empty = [t for t in tables if conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] == 0]
    assert [t for t in empty if t not in UNUSED_ON_SQLITE] == [], "the test's home must have rows in every table"
    assert {"sessions", "messages", "routes", "inbox", "deliveries", "facts", "cron_runs", "model_calls_daily",
            "meta", "approved_users", "dead_letters", "chat_prefs", "tool_approvals",
            "tool_questions", "a2a_tasks", "signatures_seen", "delivery_receipts", "mcp_auth",
            "mcp_auth_flows"} <= set(tables)

    result = _cli("--to", pg_url, "--home", str(home))

    assert result.exit_code == 0, result.output
    assert "counts and" in result.output and "sample searches agree" in result.output
    assert "DIFFERS" not in result.output
    assert "search '记忆系' (sessions)" in result.output and "search 'kubernetes' (sessions)" in result.output
    for table in tables:
        assert _rows(pg_url, table) == _rows(path, table), table
    with state.SessionDB(pg_url) as db:
        assert db.sessions.get("child").parent_session_id == "root"
        assert db.prefs.get("telegram:dm:u1", "stream") == "off"
        assert db.budgets.spent(["user:alice"], ["d:2026-01-01"]) == {("user:alice", "d:2026-01-01"): (0.5, 5)}
        assert db.approvals.get("0a1b2c3d")["status"] == "pending"
        assert db.questions.get("q1w2e3r4")["field"] == "city"
        assert [m["name"] for m in db.media.of_lineage("child")] == ["rollout.log"]
        assert db.routes.session("telegram:dm:u1")["id"] == "child"
        assert db.pairing.is_approved("telegram", "u3")
        assert [h["session_id"] for h in db.search.messages("kubernetes")] == ["child"]
        assert [h["session_id"] for h in db.search.messages("kubectl")] == ["root"]
        assert [h["session_id"] for h in db.search.messages("记忆系统")] == ["other"]


def test_the_targets_next_ids_follow_the_copied_ones(tmp_path, pg_url):
    home = tmp_path / "home"
    path = _fill_every_table(home)
    with state.SessionDB(path) as db:  # an AUTOINCREMENT id deleted before the move is not given out again
        doomed = db.messages.append("root", "user", "this one is deleted")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM messages WHERE id = ?", (doomed,))
        tops = {t: conn.execute(f"SELECT max(id) FROM {t}").fetchone()[0]
                for t in ("cron_runs", "facts", "dead_letters", "model_calls")}

    result = _cli("--to", pg_url, "--home", str(home), "--batch-size", "1")  # every row its own transaction

    assert result.exit_code == 0, result.output
    with state.SessionDB(pg_url) as db:
        assert db.sessions.get("early").parent_session_id == "late"
        assert db.messages.append("root", "user", "after the move") == doomed + 1
        assert db.facts.add("agent", "u1", "a new fact", [], session_id=None, trust=0.5, now=NOW, hrr=None) \
            == tops["facts"] + 1
        assert db.dead_letters.add(platform="slack", event_id=None, payload="{}", message=None, error="x") \
            == tops["dead_letters"] + 1
        assert db.usage.record_call({"at": NOW, "purpose": "turn", "model": "m", "outcome": "ok"}) \
            == tops["model_calls"] + 1
        run = db.cron.begin_run("j", holder="h2", now=NOW + 7200, lease_seconds=60, trigger="manual",
                                scheduled_at=None, deliver="local")
        assert run["status"] == "running" and run["run"]["id"] == tops["cron_runs"] + 1


def test_dry_run_shows_the_tables_and_writes_nothing(tmp_path, pg_url):
    home = tmp_path / "home"
    _fill_every_table(home)

    result = _cli("--to", pg_url, "--home", str(home), "--dry-run")

    assert result.exit_code == 0, result.output
    assert "messages" in result.output and "model_calls_daily" in result.output
    assert "nothing was written" in result.output
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables "
                            "WHERE table_schema = current_schema()").fetchone()[0] == 0


def test_refused_while_a_daemon_runs_on_the_home(tmp_path, pg_url):
    home = tmp_path / "home"
    _fill_every_table(home)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from gateway.runtime import lockfile; "
         "lock = lockfile.acquire(__import__('pathlib').Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
         str(home)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lockfile.is_locked(home)

        result = _cli("--to", pg_url, "--home", str(home))
        dry = _cli("--to", pg_url, "--home", str(home), "--dry-run")
    finally:
        holder.kill()
        holder.wait()

    assert result.exit_code == 1
    assert "daemon is running" in result.output and "nothing was changed" in result.output
    assert dry.exit_code == 1 and "would be refused: a switchboard daemon is running" in dry.output
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('sessions')").fetchone()[0] is None


def test_refused_when_the_target_holds_sessions_unless_replace(tmp_path, pg_url):
    home = tmp_path / "home"
    _fill_every_table(home)
    with state.SessionDB(pg_url) as db:
        db.sessions.create("theirs", "slack")
        db.messages.append("theirs", "user", "already here")

    refused = _cli("--to", pg_url, "--home", str(home))

    assert refused.exit_code == 1
    assert "target store is not empty (sessions 1, messages 1)" in refused.output
    assert "--replace" in refused.output and "nothing was copied" in refused.output
    with state.SessionDB(pg_url) as db:
        assert [s["id"] for s in db.sessions.list_rich()] == ["theirs"]

    replaced = _cli("--to", pg_url, "--home", str(home), "--replace")

    assert replaced.exit_code == 0, replaced.output
    with state.SessionDB(pg_url) as db:
        assert db.sessions.get("theirs") is None
        assert db.sessions.get("root") is not None
        assert db.search.messages("already") == []


def test_refused_while_another_client_is_connected_to_the_target(tmp_path, pg_url):
    """A running daemon keeps its pool's connection open: any other connection means the database is in use."""
    home = tmp_path / "home"
    _fill_every_table(home)
    with psycopg.connect(pg_url, application_name="switchboard-daemon") as other:
        other.execute("SELECT 1")
        result = _cli("--to", pg_url, "--home", str(home))

    assert result.exit_code == 1
    assert "1 other connection to the target database (switchboard-daemon" in result.output
    assert "nothing was copied" in result.output
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('sessions')").fetchone()[0] is None


@pytest.mark.parametrize("make_url, expected", [
    (lambda url: url.replace("@127.0.0.1", "@127.0.0.1").rsplit(":", 1)[0] + ":1/x", "cannot reach the target"),
    (lambda url: url.replace("://switchboard:", "://switchboard:wrong"), "password authentication failed"),
    (lambda url: "mysql://" + url.split("://", 1)[1], "is not a PostgreSQL URL"),
])
def test_a_bad_url_names_the_problem_without_the_password(tmp_path, pg_url, make_url, expected):
    home = tmp_path / "home"
    _fill_every_table(home)
    url = make_url(pg_url)
    password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]

    result = _cli("--to", url, "--home", str(home))

    assert result.exit_code != 0
    assert expected in result.output
    assert password not in result.output
    assert "***" in result.output


def test_a_copy_that_differs_is_reported_and_exits_non_zero(tmp_path, pg_url):
    """A target that silently drops rows (here a trigger skipping chat_prefs' rows) fails the check."""
    home = tmp_path / "home"
    _fill_every_table(home)
    state.SessionDB(pg_url).close()  # an empty store, as the copy finds it
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
        conn.execute("CREATE TRIGGER skip_prefs BEFORE INSERT ON chat_prefs FOR EACH ROW EXECUTE FUNCTION skip_row()")

    result = _cli("--to", pg_url, "--home", str(home))

    assert result.exit_code == 1
    assert "DIFFERS" in result.output and "chat_prefs" in result.output
    assert "differs from" in result.output and "do not switch store.url to it" in result.output


def test_a_target_whose_search_index_is_not_filled_fails_the_search_check(tmp_path, pg_url):
    home = tmp_path / "home"
    _fill_every_table(home)
    state.SessionDB(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE messages DISABLE TRIGGER messages_fts_sync")

    result = _cli("--to", pg_url, "--home", str(home))

    assert result.exit_code == 1
    assert "search 'kubernetes' (sessions) │      1 │          0 │ DIFFERS" in result.output


def test_rows_pointing_at_nothing_are_refused_before_anything_is_copied(tmp_path, pg_url):
    home = tmp_path / "home"
    path = _fill_every_table(home)
    with sqlite3.connect(path) as conn:  # foreign keys off: what an old or hand-edited store may hold
        conn.execute("INSERT INTO routes (session_key, session_id, updated_at) VALUES ('k', 'gone', 1.0)")

    result = _cli("--to", pg_url, "--home", str(home))

    assert result.exit_code == 1
    assert "rows referring to rows that are gone (1 in routes" in result.output
    assert "nothing was copied" in result.output
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('sessions')").fetchone()[0] is None


def test_back_to_sqlite_is_a_sessions_export_and_import(tmp_path, pg_url):
    """The way back docs/postgresql.md gives: `sessions export` with store.url set, `sessions import` into a home
    without it; sessions, their messages and lineage come back, search finds them."""
    home = tmp_path / "home"
    _fill_every_table(home)
    assert _cli("--to", pg_url, "--home", str(home)).exit_code == 0
    config = tmp_path / "pg.yaml"
    config.write_text(f"store:\n  url: {pg_url}\n")
    dump = tmp_path / "sessions.jsonl"
    back = tmp_path / "back"

    exported = CliRunner().invoke(main, ["sessions", "export", str(dump), "--config", str(config)])
    imported = CliRunner().invoke(main, ["sessions", "import", str(dump), "--home", str(back)])

    assert exported.exit_code == 0, exported.output
    assert imported.exit_code == 0, imported.output
    assert "imported 5 sessions (34 messages)" in imported.output
    assert _rows(back / "state.db", "messages") == _rows(home / "state.db", "messages")
    with state.SessionDB(back / "state.db") as db:
        assert db.sessions.get("early").parent_session_id == "late"
        assert [h["session_id"] for h in db.search.messages("kubectl")] == ["root"]
        assert db.cron.list_jobs() == []  # what an export does not carry: see docs/postgresql.md
