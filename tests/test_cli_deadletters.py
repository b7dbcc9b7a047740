"""`switchboard deadletters list|show|retry|drop`: what an operator sees and can do with the events set aside."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.runtime.deadletters import dead_letter_row
from gateway.types import ChatType, InboundMessage
from state import SessionDB
from tests.fakes.model_server import FakeModel

TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"
MESSAGE = InboundMessage("telegram", ChatType.DM, "111", "111", "hello", message_id="100", user_name="Ann")


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with SessionDB(home / "state.db") as db:
        db.dead_letters.add(**dead_letter_row("telegram", "41", {"update_id": 41, "raw": "\x00"}, None,
                                             "ValueError: unreadable"))
        db.dead_letters.add(**dead_letter_row(
            "telegram", "42", {"update_id": 42, "message": {"text": f"bot {TOKEN}"}}, MESSAGE,
            f"IntegrityError: refused at https://api.telegram.org/bot{TOKEN}/getUpdates"))
    return home


def run(home, *args):
    return CliRunner().invoke(main, ["deadletters", *args, "--home", str(home)])


def test_list_shows_each_dead_letter_newest_first(home):
    result = run(home, "list")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].split()[:6] == ["ID", "Platform", "Event", "State", "Tries", "When"]
    assert [line.split()[:5] for line in lines[1:]] == [["2", "telegram", "42", "held", "3"], ["1", "telegram", "41", "held", "3"]]
    assert TOKEN not in result.output


def test_list_json_and_status_filter(home):
    run(home, "drop", "1")
    rows = json.loads(run(home, "list", "--json").output)
    assert [(r["id"], r["status"]) for r in rows] == [(2, "held"), (1, "dropped")]
    assert rows[0]["payload"] == {"message": {"text": "bot ***"}, "update_id": 42}
    assert rows[0]["message"]["text"] == "hello"
    assert [r["id"] for r in json.loads(run(home, "list", "--status", "dropped", "--json").output)] == [1]
    assert run(home, "list", "--status", "retry").output.strip() == "No dead letters in state retry."


def test_show_prints_the_error_and_the_masked_payload(home):
    result = run(home, "show", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Dead letter 2" in out and "State       held after 3 failed attempts" in out
    assert "Error       IntegrityError: refused at https://api.telegram.org/bot***/getUpdates" in out
    assert "Replay      possible: the message from Ann in chat 111 is kept" in out
    assert '"text": "bot ***"' in out
    assert TOKEN not in out
    data = json.loads(run(home, "show", "2", "--json").output)
    assert data["payload"]["update_id"] == 42 and data["error"].startswith("IntegrityError")
    assert "not possible: it failed before it was read into a message" in run(home, "show", "1").output


def test_retry_marks_the_row_for_the_daemon_and_says_so(home):
    result = run(home, "retry", "2")
    assert result.exit_code == 0, result.output
    assert "dead letter 2 is marked for retry: the running daemon replays it within a few seconds" in result.output
    assert "already marked for retry" in run(home, "retry", "2").output
    with SessionDB(home / "state.db") as db:
        assert db.dead_letters.get(2)["status"] == "retry"
        db.dead_letters.set_status(2, "retried")
    again = run(home, "retry", "2")
    assert again.exit_code == 1 and "was already replayed" in again.output


def test_retry_refuses_an_event_that_never_became_a_message_and_says_why(home):
    result = run(home, "retry", "1")
    assert result.exit_code == 1
    assert "dead letter 1 cannot be replayed: it failed before it was read into a message" in result.output
    assert "switchboard deadletters drop 1" in result.output
    with SessionDB(home / "state.db") as db:
        assert db.dead_letters.get(1)["status"] == "held"


def test_drop_and_unknown_ids(home):
    assert run(home, "drop", "2").output.strip() == "dead letter 2 dropped"
    assert run(home, "drop", "2").output.strip() == "dead letter 2 was already dropped"
    with SessionDB(home / "state.db") as db:
        assert db.dead_letters.count() == 1
    missing = run(home, "show", "99")
    assert missing.exit_code == 1 and "there is no dead letter 99 (see: switchboard deadletters list)" in missing.output


def test_an_empty_store_lists_nothing(tmp_path):
    assert run(tmp_path, "list").output.strip() == "No dead letters."


async def test_doctor_counts_held_dead_letters_and_says_what_to_do(home, tmp_path):
    async with FakeModel(model_name="fake-model") as model:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"home": str(home), "model": {"base_url": model.base_url, "name": "fake-model"}}))
        result = await asyncio.to_thread(CliRunner().invoke, main, ["doctor", "--config", str(config)],
                                         env={"HTTP_PROXY": "", "HTTPS_PROXY": ""})
    lines = result.output.splitlines()
    [check] = [line for line in lines if line[2:].startswith("dead letters:")]
    assert check == "✗ dead letters: 2 events set aside after failing three times"
    assert "fix: see them with: switchboard deadletters list" in lines[lines.index(check) + 1]
    assert result.exit_code == 1
