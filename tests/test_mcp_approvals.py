"""Approvals that bind the exact call: a tool marked ``approval: always | once_per_session`` runs only after
a person answered, with exactly the arguments shown, through ``/approve`` (local API here; the platforms'
buttons in tests/test_mcp_approval_buttons.py).  The tool is a real SDK server (tests/mcp_servers/
ledger_server.py) that appends a line per call, so every test counts how many times a call really ran."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from gateway.approvals import canonical_call, request_text
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import ApiClient, eventually, running_gateway

pytestmark = [pytest.mark.processes, pytest.mark.slow]

LEDGER = str(Path(__file__).resolve().parent / "mcp_servers" / "ledger_server.py")
REQUEST_ID = re.compile(r"/approve ([0-9a-f]{8})")


def ledger_server(**overrides) -> dict:
    return {"command": sys.executable, "args": [LEDGER], "env": {"PYTHONCOERCECLOCALE": "0"},
            "allow": ["ledger__*"], "approval": "always", **overrides}


def lines(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


def request_id(text: str) -> str:
    found = REQUEST_ID.search(text)
    assert found, f"no approval request in {text!r}"
    return found.group(1)


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _ready(gw, name: str = "ledger"):
    server = gw.mcp.servers[name]
    await eventually(lambda: server.available, 20, lambda: f"{name} ready ({server.state}: {server.last_error})")


def _tools(**server) -> dict:
    return {"mcp_servers": {"ledger": ledger_server(**server)}}


async def test_a_call_runs_only_after_approve_with_exactly_the_arguments_shown(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "pay 10 EUR", "path": str(target)}), Reply("appended it"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        asked = await api.say("ann", "note the payment")
        assert lines(target) == []  # nothing runs before the answer
        assert "ledger__append" in asked and '"text": "pay 10 EUR"' in asked and str(target) in asked
        rid = request_id(asked)
        assert len(model.requests) == 1  # the turn ended with the request: no model call is held open
        assert await api.say("ann", f"/approve {rid}") == "appended it"
        assert lines(target) == ["pay 10 EUR"]
        again = await api.say("ann", f"/approve {rid}")
        await api.close()
        row = await gw.db.approvals.get(rid)
        session = await gw.db.routes.get("agent:main:api:dm:ann")
        stored = await gw.db.messages.get(session)
    assert again == f"Request {rid} (ledger__append) was already answered: approved and run."
    assert lines(target) == ["pay 10 EUR"]  # once
    canonical, digest = canonical_call("ledger__append", {"path": str(target), "text": "pay 10 EUR"})
    assert (row["status"], row["arguments"], row["call_hash"], row["decided_by"]) == ("done", canonical, digest,
                                                                                        "api:ann")
    # the model got the result as the call's tool message, right after its call, and went on from there
    assert [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"] == ["appended 'pay 10 EUR'"]
    assert [(m.role, m.content if m.role != "assistant" or not m.tool_calls else "call")
            for m in stored] == [("user", "note the payment"), ("assistant", "call"),
                                 ("tool", "appended 'pay 10 EUR'"), ("assistant", "appended it")]


async def test_deny_gives_the_model_the_denial_as_the_result_and_nothing_runs(tmp_path, model, monkeypatch):
    from click.testing import CliRunner

    from gateway.cli.sessions import sessions

    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "x", "path": str(target)}), Reply("ok, I will not"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append x"))
        assert await api.say("ann", "/deny") == "ok, I will not"  # the only one waiting: no id needed
        await api.close()
        session = await gw.db.routes.get("agent:main:api:dm:ann")
    assert lines(target) == []
    monkeypatch.setenv("SWITCHBOARD_HOME", str(tmp_path))
    shown = CliRunner().invoke(sessions, ["show", session], catch_exceptions=False).output
    assert "tool (ledger__append)  [denied by api:ann at " in shown and f"request {rid}, sha256 " in shown
    as_json = json.loads(CliRunner().invoke(sessions, ["show", session, "--json"], catch_exceptions=False).output)
    assert [(a["id"], a["status"], a["decided_by"]) for a in as_json["approvals"]] == [(rid, "denied", "api:ann")]
    exported = CliRunner().invoke(sessions, ["export", "-", "--session-id", session], catch_exceptions=False).output
    [record] = [json.loads(line) for line in exported.splitlines() if line.startswith("{")]
    assert [(a["id"], a["status"], a["tool"]) for a in record["approvals"]] == [(rid, "denied", "ledger__append")]
    [result] = [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"]
    assert result.startswith("error: the user denied this call to ledger__append; it was not run")


async def test_other_arguments_after_an_approval_ask_again(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "first", "path": str(target)}),
                 ToolCall("ledger__append", {"text": "second", "path": str(target)}),
                 Reply("both done"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        first = request_id(await api.say("ann", "append two lines"))
        asked_again = await api.say("ann", f"/approve {first}")
        assert lines(target) == ["first"]  # the approved arguments, and only them
        second = request_id(asked_again)
        assert second != first and '"text": "second"' in asked_again
        assert (await api.say("ann", f"/approve {first}")).endswith("was already answered: approved and run.")
        assert lines(target) == ["first"]
        assert await api.say("ann", f"/approve {second}") == "both done"
        await api.close()
    assert lines(target) == ["first", "second"]


async def test_once_per_session_asks_the_first_time_only(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "a", "path": str(target)}), Reply("did a"),
                 ToolCall("ledger__append", {"text": "b", "path": str(target)}), Reply("did b"))
    async with running_gateway(tmp_path, model, tools=_tools(approval="never",
                                                             tool_approval={"append": "once_per_session"})) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append a"))
        assert await api.say("ann", f"/approve {rid}") == "did a"
        assert await api.say("ann", "append b") == "did b"  # approved once for the session: no question
        await api.close()
    assert lines(target) == ["a", "b"]


async def test_only_the_sessions_user_or_an_approver_can_answer(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "x", "path": str(target)}), Reply("done"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append x"))
        # another API user is another chat: the request is not even found there
        assert await api.say("bob", f"/approve {rid}") == f"There is no approval request {rid} in this chat."
        await api.close()
        assert (await gw.db.approvals.get(rid))["status"] == "pending"
    assert lines(target) == []


async def test_an_unanswered_request_is_denied_after_the_timeout(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "late", "path": str(target)}), Reply("it was not approved in time"))
    async with running_gateway(tmp_path, model, tools={**_tools(), "approval_timeout": 1}) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append late"))
        await eventually(lambda: len(model.requests) == 2, 10, "the model called again with the denial")
        row = await gw.db.approvals.get(rid)
        answer = await api.say("ann", f"/approve {rid}")
        await api.close()
    assert row["status"] == "expired" and lines(target) == []
    [result] = [m["content"] for m in model.requests[1].messages if m["role"] == "tool"]
    assert result.startswith("error: nobody approved this call to ledger__append within 1 seconds")
    assert answer == f"Request {rid} (ledger__append) was already answered: denied (no answer in time)."


def test_the_request_shows_the_arguments_cut_to_fit_the_platform_and_bound_to_the_whole_call():
    args = {"text": "y" * 10_000, "path": "/tmp/x"}
    canonical, digest = canonical_call("ledger__append", args)
    for platform, limit in (("discord", 2000), ("slack", 3000), ("telegram", 4096)):
        text = request_text("0123abcd", "ledger__append", canonical, digest, platform=platform, timeout=600)
        assert len(text) <= limit, (platform, len(text))
        assert "/approve 0123abcd" in text and "/deny 0123abcd" in text and f"sha256 {digest[:16]}" in text
        assert "more characters not shown; approving runs the whole call" in text
    # the arguments cannot break out of the block they are shown in
    sneaky = canonical_call("t__t", {"x": "```\n/approve deadbeef\n```"})
    shown = request_text("0123abcd", "t__t", *sneaky, platform="telegram", timeout=600)
    assert shown.count("```") == 2
    # key order and spacing do not change the call; a changed value does
    assert canonical_call("a__b", {"x": 1, "y": [1, 2]}) == canonical_call("a__b", json.loads('{"y":[1,2],  "x":1}'))
    assert canonical_call("a__b", {"x": 1})[1] != canonical_call("a__b", {"x": 2})[1]
    assert canonical_call("a__b", {"x": 1})[1] != canonical_call("a__c", {"x": 1})[1]


async def test_a_request_in_a_cron_job_is_refused_without_running(tmp_path, model):
    """Nobody can answer in a scheduled job: the call is refused, the model reads why."""
    from gateway.tools import ToolContext

    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        ctx = ToolContext(session_id="s", session_key="k", platform="cron", user_id=None, agent="main")
        verdict = await gw.services.approvals.check(ctx, "c1", "ledger__append", '{"text": "x", "path": "/tmp/y"}')
    assert isinstance(verdict, str) and "nobody can answer here" in verdict
    await asyncio.sleep(0)


async def test_the_terminal_chat_answers_with_approve_and_shows_the_continued_answer(tmp_path, model):
    import io

    from rich.console import Console

    from gateway.cli.chat import _Chat

    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "from the terminal", "path": str(target)}),
                 Reply("written from the terminal"))
    typed = iter(["append from the terminal", "/approve"])

    def read_line() -> str:
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    out = Console(file=io.StringIO(), width=200, color_system=None, record=True)
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        await _Chat(gw.router.requests, out, out, False).run(None, None, read_line)
    shown = out.export_text()
    assert "Approval needed: **ledger__append**" in shown or "Approval needed: ledger__append" in shown
    assert '"text": "from the terminal"' in shown
    assert shown.index("Approval needed") < shown.index("written from the terminal")
    assert lines(target) == ["from the terminal"]


def test_the_approval_settings_are_checked_when_the_config_is_read(tmp_path):
    from gateway.config import config_from_dict
    from gateway.errors import ConfigError

    base = {"home": str(tmp_path), "identities": {"ops": ["telegram:1", "slack:U2"]}}
    cfg = config_from_dict({**base, "tools": {"approvers": ["ops", "discord:9"], "approval_timeout": "2m",
                                              "mcp_servers": {"ledger": ledger_server(tool_approval={"look": "never"})}}},
                           env={})
    assert cfg.tools.approval_timeout == 120
    assert cfg.tools.mcp_servers["ledger"].approval_for("append") == "always"
    assert cfg.tools.mcp_servers["ledger"].approval_for("look") == "never"
    with pytest.raises(ConfigError, match="tools.approvers.0"):
        config_from_dict({**base, "tools": {"approvers": ["nobody"]}}, env={})
    with pytest.raises(ConfigError, match="approval"):
        config_from_dict({**base, "tools": {"mcp_servers": {"ledger": ledger_server(approval="sometimes")}}}, env={})


async def test_approve_in_a_streamed_api_request_streams_the_continued_answer(tmp_path, model):
    target = tmp_path / "ledger.txt"
    model.script(ToolCall("ledger__append", {"text": "streamed", "path": str(target)}), Reply("appended, streamed"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append streamed"))
        stream = await api.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": f"/approve {rid}"}], stream=True,
            extra_headers={"X-Session-Key": "ann"})
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        await api.close()
    assert text == "appended, streamed"
    assert lines(target) == ["streamed"]


async def test_a_call_changed_in_the_store_after_the_request_is_not_run(tmp_path, model):
    """The hash binds what runs to what was shown: arguments changed between the request and the answer
    (here written into the store behind the gateway's back) are refused, and the model is told."""
    import sqlite3

    target, other = tmp_path / "ledger.txt", tmp_path / "other.txt"
    model.script(ToolCall("ledger__append", {"text": "safe", "path": str(target)}), Reply("refused, as it should"))
    async with running_gateway(tmp_path, model, tools=_tools()) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "append safe"))
        changed = json.dumps({"path": str(other), "text": "evil"}, sort_keys=True, separators=(",", ":"))
        with sqlite3.connect(tmp_path / "state.db") as conn:
            conn.execute("UPDATE tool_approvals SET arguments = ? WHERE id = ?", (changed, rid))
        assert await api.say("ann", f"/approve {rid}") == "refused, as it should"
        await api.close()
    assert lines(target) == [] and lines(other) == []
    [result] = [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"]
    assert result == "error: the approved call to ledger__append does not match what was approved; it was not run"


async def test_parallel_calls_those_before_the_request_run_those_after_it_wait(tmp_path, model):
    from tests.fakes.model_server import ToolCalls

    target = tmp_path / "ledger.txt"
    model.script(ToolCalls([ToolCall("ledger__look", {"path": str(target)}, call_id="c1"),
                            ToolCall("ledger__append", {"text": "mid", "path": str(target)}, call_id="c2"),
                            ToolCall("ledger__look", {"path": str(target)}, call_id="c3")]),
                 Reply("looked, appended"))
    async with running_gateway(tmp_path, model, tools=_tools(tool_approval={"look": "never"})) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        rid = request_id(await api.say("ann", "look, append, look"))
        assert await api.say("ann", f"/approve {rid}") == "looked, appended"
        await api.close()
    results = {m["tool_call_id"]: m["content"] for m in model.requests[-1].messages if m["role"] == "tool"}
    assert results == {
        "c1": "0",  # ran before the request
        "c2": "appended 'mid'",  # ran once approved
        "c3": "error: not run: it was asked together with a call to ledger__append, which waits for the user's "
              "approval; call it again after that answer if it is still needed",
    }
    assert lines(target) == ["mid"]
