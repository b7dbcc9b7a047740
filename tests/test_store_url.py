"""``store.url``: the daemon, the CLI and doctor on a PostgreSQL store, and a password that never shows."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from gateway.cli.doctor import check_postgresql
from gateway.cli.main import main
from gateway.config import config_from_dict
from gateway.errors import ConfigError
from state import SessionDB
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


@pytest.mark.parametrize("url, says", [
    ("mysql://bob:hunter2@db/sb", "must be empty (SQLite at $home/state.db) or a postgresql://"),
    ("postgresql://bob:hunter2@db:port/sb", "is not a valid URL"),
])
def test_a_bad_store_url_names_the_key_and_hides_the_password(url, says):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"store": {"url": url}})
    assert caught.value.key == "store.url"
    assert says in str(caught.value) and "hunter2" not in str(caught.value)


def test_the_password_is_a_secret_of_the_config():
    cfg = config_from_dict({"store": {"url": "postgresql://bob:hunter2@db:5432/sb"}})
    assert cfg.store_target == "postgresql://bob:hunter2@db:5432/sb"
    assert "hunter2" in cfg.secrets()  # the log redactor masks it wherever it appears
    assert "hunter2" not in json.dumps(cfg.redacted()) and "hunter2" not in repr(cfg)
    assert config_from_dict({}).store_target == config_from_dict({}).db_path


async def test_the_daemon_stores_and_answers_on_postgresql(tmp_path, model, pg_url, pg_cluster):
    async with running_gateway(tmp_path, model, store={"url": pg_url}) as gw:
        api = ApiClient(gw)
        reply = await api.say("alice", "hello over postgres")
        await api.close()
        health = json.dumps(gw.health())
    assert pg_cluster.password not in health
    assert not (tmp_path / "state.db").exists()  # nothing written to SQLite
    with SessionDB(pg_url) as db:
        [session] = db.sessions.list_rich()
        stored = [(m.role, m.content) for m in db.messages.get(session["id"])]
    assert stored == [("user", "hello over postgres"), ("assistant", reply)]


def test_the_cli_opens_the_configured_store(tmp_path, pg_url, monkeypatch):
    with SessionDB(pg_url) as db:
        db.sessions.create("20250301_100000_aaaa0001", "telegram", title="on postgres")
        db.messages.append("20250301_100000_aaaa0001", "user", "stored in PostgreSQL")
    config = tmp_path / "config.yaml"
    config.write_text("store:\n  url: ${SB_STORE_URL}\n")
    monkeypatch.setenv("SB_STORE_URL", pg_url)
    listed = CliRunner().invoke(main, ["sessions", "list", "--json", "--config", str(config)])
    assert listed.exit_code == 0, listed.output
    assert [s["title"] for s in json.loads(listed.output)] == ["on postgres"]
    found = CliRunner().invoke(main, ["sessions", "search", "PostgreSQL", "--json", "--config", str(config)])
    assert [h["session_id"] for h in json.loads(found.output)] == ["20250301_100000_aaaa0001"]
    with SessionDB(pg_url) as db:
        db.usage.record_call({"at": time.time(), "purpose": "turn", "model": "pg-model", "outcome": "ok",
                              "prompt_tokens": 30, "completion_tokens": 12})
    usage = CliRunner().invoke(main, ["insights", "--json", "--config", str(config)])
    assert usage.exit_code == 0, usage.output
    assert [(r["name"], r["calls"], r["output_tokens"]) for r in json.loads(usage.output)["rows"]] == [("pg-model", 1, 12)]
    monkeypatch.setenv("SB_STORE_URL", "redis://x:topsecret@h/0")
    refused = CliRunner().invoke(main, ["sessions", "list", "--config", str(config)])
    assert refused.exit_code == 78 and "store.url" in refused.output and "topsecret" not in refused.output


def test_doctor_reaches_the_store_without_showing_its_password(pg_url, pg_cluster):
    [ok] = check_postgresql(pg_url)
    assert ok.ok and "schema version 0" in ok.detail and "migrates at next start" in ok.detail
    SessionDB(pg_url).close()
    [migrated] = check_postgresql(pg_url)
    assert migrated.ok and "migrates" not in migrated.detail
    [down] = check_postgresql(pg_cluster.url("no_such_database"))
    assert down.ok is False and "no_such_database" in down.detail and "store.url" in down.fix
    assert pg_cluster.password not in ok.detail + migrated.detail + down.detail


@pytest.mark.parametrize("command", [["backup", "out.db"], ["restore", "in.db"], ["maintenance"]])
def test_the_sqlite_file_tools_refuse_a_postgresql_store_and_say_what_instead(tmp_path, monkeypatch, command):
    config = tmp_path / "config.yaml"
    config.write_text("store:\n  url: postgresql://bob:hunter2@db.example:5432/sb\n")
    result = CliRunner().invoke(main, [*command, "--config", str(config)])
    assert result.exit_code == 1
    assert "store.url points at PostgreSQL (postgresql://bob:***@db.example:5432/sb)" in result.output
    assert "hunter2" not in result.output and ("pg_dump" in result.output or "pg_restore" in result.output
                                               or "autovacuum" in result.output)
