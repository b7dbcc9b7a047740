"""`switchboard tools list|show|call` and `/tools`: the operator and the user see what the agent may use."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli.main import main
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, eventually, running_gateway

# The commands start the echo server as a subprocess.
pytestmark = [pytest.mark.processes, pytest.mark.slow]

ECHO = str(Path(__file__).resolve().parent / "mcp_servers" / "echo_server.py")
SERVERS = {"echo": {"command": sys.executable, "args": [ECHO], "allow": ["echo__e*"], "deny": ["echo__environment"]}}


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "config.yaml"
    # a token elsewhere in the file that the shell does not export stops nothing: only `tools` is read
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "model": {"api_key": "${NOT_EXPORTED_KEY}"},
                                    "tools": {"mcp_servers": SERVERS}}))
    return path


def run(config: Path, *args: str):
    return CliRunner().invoke(main, ["tools", *args, "--config", str(config)])


def test_list_shows_every_tool_and_whether_the_model_is_offered_it(config):
    result = run(config, "list", "--json")
    assert result.exit_code == 0, result.output
    [server] = json.loads(result.stdout)
    offered = {t["name"]: t["offered"] for t in server["tools"]}
    assert (server["server"], server["state"]) == ("echo", "ready")
    assert offered == {"echo__big": False, "echo__book": False, "echo__calls": False, "echo__die": False,
                       "echo__echo": True, "echo__environment": False, "echo__fail": False, "echo__grow": False, "echo__peak": False, "echo__pid": False,
                       "echo__slow": False}


def test_show_gives_the_arguments_and_call_runs_the_tool(config):
    shown = run(config, "show", "echo__echo", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["parameters"]["required"] == ["text"]
    called = run(config, "call", "echo__echo", '{"text": "from the shell"}')
    assert (called.exit_code, called.stdout) == (0, "echo: from the shell\n")


def test_call_says_when_a_tool_is_not_offered_and_exits_1_on_an_error(config):
    failed = run(config, "call", "echo__fail", '{"why": "testing"}')
    assert failed.exit_code == 1
    assert failed.stdout == "error: Error executing tool fail: cannot do that: testing\n"
    assert "note: echo__fail is not offered to the model" in failed.stderr


@pytest.mark.parametrize("args, says", [
    (("call", "echo__nope"), "the echo server has no tool 'echo__nope'"),
    (("call", "other__echo"), "'other__echo' is not <server>__<tool> of an enabled MCP server (servers: echo)"),
    (("call", "echo__echo", "[1]"), "the arguments must be a JSON object"),
    (("call", "echo__echo", "{text"), "the arguments are not JSON"),
])
def test_mistakes_say_what_to_do(config, args, says):
    result = run(config, *args)
    assert result.exit_code == 1 and says in result.output


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def test_slash_tools_lists_what_this_chat_may_use(tmp_path, model):
    async with running_gateway(tmp_path, model, tools={"mcp_servers": SERVERS}) as gw:
        server = gw.mcp.servers["echo"]
        await eventually(lambda: server.available, 20, "the echo server ready")
        api = ApiClient(gw)
        shown = await api.say("ann", "/tools")
        assert gw.health()["tool_servers"] == {"echo": {"state": "ready", "tools": 11, "last_error": None}}
        await server.stop()  # the server is gone: its tool stays listed, marked unavailable
        down = await api.say("ann", "/tools")
        await api.close()
    assert "- echo__echo: Say the text back." in shown.splitlines()
    assert "- session_search:" in shown and "- memory:" in shown
    assert "echo__environment" not in shown and "echo__fail" not in shown  # not allowed: not listed
    assert "- echo__echo: Say the text back. (unavailable now: the echo tool server is stopped)" in down.splitlines()


def test_list_without_any_server_names_the_built_in_tools_and_succeeds(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home")}))
    result = run(path, "list")
    assert result.exit_code == 0, result.output
    assert "No MCP server is configured" in result.output and "session_search, memory" in result.output
    as_json = run(path, "list", "--json")
    assert (as_json.exit_code, json.loads(as_json.stdout)) == (0, [])


async def test_show_and_slash_tools_say_which_tools_ask_for_approval(tmp_path, model):
    servers = {"echo": {**SERVERS["echo"], "tool_approval": {"echo": "always"}}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "tools": {"mcp_servers": servers}}))
    shown = await asyncio.to_thread(run, config, "show", "echo__echo")
    assert shown.exit_code == 0, shown.output
    assert "Approval    always: each call waits for a yes" in shown.stdout
    async with running_gateway(tmp_path, model, tools={"mcp_servers": servers}) as gw:
        await eventually(lambda: gw.mcp.servers["echo"].available, 20, "the echo server ready")
        api = ApiClient(gw)
        listed = await api.say("ann", "/tools")
        await api.close()
    assert "- echo__echo: Say the text back. (asks for approval at each call)" in listed.splitlines()
