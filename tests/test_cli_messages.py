"""What the CLI says for the mistakes a new operator makes, and the singular/plural of its counts."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.platforms import installed_platforms
from state import SessionDB


@pytest.fixture
def store(home):
    with SessionDB(home / "state.db") as db:
        db.sessions.create("20260101_000000_aaaa0001", "api", user_id="k")
        db.messages.append("20260101_000000_aaaa0001", "user", "deploy the docker stack")
        db.messages.append("20260101_000000_aaaa0001", "assistant", "docker compose up -d")
    return home


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_source_in_capitals_means_that_source(store):
    rows = json.loads(run("sessions", "list", "--source", "API", "--json").output)
    assert [r["id"] for r in rows] == ["20260101_000000_aaaa0001"]
    hits = json.loads(run("sessions", "search", "docker", "--source", "Api", "--role", "USER", "--json").output)
    assert [h["role"] for h in hits] == ["user"]


@pytest.mark.parametrize("args, option", [
    (("sessions", "search", "docker", "--role", "bogus"), "--role"),
    (("sessions", "list", "--source", "sms"), "--source"),
    (("sessions", "export", "-", "--source", "sms"), "--source"),
    (("sessions", "prune", "--source", "sms"), "--source"),
])
def test_an_unknown_role_or_source_is_an_error_listing_the_valid_ones(store, args, option):
    result = run(*args)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output
    sources = ", ".join(f"'{name}'" for name in (*installed_platforms(), "api", "cli", "cron"))
    valid = "'user', 'assistant', 'tool', 'system'" if option == "--role" else sources
    assert valid in result.output


def test_one_session_is_singular(store, tmp_path):
    result = run("sessions", "export", tmp_path / "one.jsonl")
    assert result.output == f"exported 1 session to {tmp_path / 'one.jsonl'}\n"
    other = tmp_path / "other"
    result = run("sessions", "import", tmp_path / "one.jsonl", "--home", other)
    assert result.output == f"imported 1 session (2 messages) from {tmp_path / 'one.jsonl'}\n"


def test_importing_a_missing_file_names_the_file_not_a_line(store, tmp_path):
    result = run("sessions", "import", tmp_path / "nope.jsonl")
    assert result.exit_code == 2
    assert f"'{tmp_path / 'nope.jsonl'}' does not exist" in result.output and "line 0" not in result.output


def test_pairing_an_unknown_platform_says_so(store):
    for args in (("pairing", "approve", "xmpp", "K7M2XQ9P"), ("pairing", "revoke", "xmpp", "42")):
        result = run(*args)
        assert result.exit_code == 2
        assert "'xmpp' is not one of 'telegram', 'discord', 'slack', 'email', 'webhook', 'matrix', 'whatsapp', 'signal'" in result.output


def test_pairing_list_json(store):
    with SessionDB(store / "state.db") as db:
        db.pairing.request("telegram", "42", "Ann", "K7M2XQ9P", now=time.time(), ttl=3600, max_pending=3)
    approved = run("pairing", "approve", "Telegram", "k7m2xq9p")
    assert approved.exit_code == 0 and "Approved telegram user 42" in approved.output
    data = json.loads(run("pairing", "list", "--json").output)
    assert data["pending"] == []
    assert [{k: a[k] for k in ("platform", "user_id", "user_name")} for a in data["approved"]] == [
        {"platform": "telegram", "user_id": "42", "user_name": "Ann"}]
    assert isinstance(data["approved"][0]["approved_at"], float)
