"""Who may use which MCP tool (tools.rules and each server's allow/deny), with the real echo server
(tests/mcp_servers/echo_server.py): each chat and user is offered exactly its tools, /tools lists
exactly those, a scheduled job only the tools it names."""

from __future__ import annotations

import pytest

from gateway.config import config_from_dict
from gateway.errors import ConfigError
from gateway.tools import ToolContext, ToolRegistry
from gateway.tools_mcp import McpTools
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import ApiClient, running_gateway
from tests.test_mcp_tools import _ready, echo_server

pytestmark = [pytest.mark.processes, pytest.mark.slow]

RULES = [
    {"allow": ["echo__echo"]},                                             # everyone
    {"allow": ["echo__pid", "echo__slow"], "users": ["telegram:42", "discord:42"]},
    {"allow": ["echo__big"], "chats": ["telegram:-100"]},
    {"deny": ["echo__slow"], "platforms": ["discord"]},
    {"allow": ["echo__environment"], "agents": ["other"]},
]


def ctx(platform: str, user: str | None, key: str, agent: str = "main") -> ToolContext:
    return ToolContext(session_id="s", session_key=key, platform=platform, user_id=user, agent=agent)


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def test_each_chat_and_user_is_offered_exactly_its_tools(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path), "tools": {
        "rules": RULES, "mcp_servers": {"echo": echo_server(allow=[], deny=["echo__die"])}}}, env={})
    registry = ToolRegistry()
    tools = McpTools(cfg.tools, registry)
    tools.start()
    try:
        await _ready(tools)
        seen = {who: sorted(registry.offered(c)) for who, c in {
            "telegram 42, dm": ctx("telegram", "42", "agent:main:telegram:dm:42"),
            "telegram 7, group -100": ctx("telegram", "7", "agent:main:telegram:group:-100:7"),
            "telegram 7, dm": ctx("telegram", "7", "agent:main:telegram:dm:7"),
            "discord 42": ctx("discord", "42", "agent:main:discord:dm:42"),
            "agent other": ctx("slack", "U1", "agent:other:slack:dm:U1", agent="other"),
            "cron": ctx("cron", None, "agent:main:cron:morning"),
        }.items()}
        listed = [name for name, _, _ in tools.listing(ctx("telegram", "7", "agent:main:telegram:group:-100:7"))]
    finally:
        await tools.stop()
    assert seen == {
        "telegram 42, dm": ["echo__echo", "echo__pid", "echo__slow"],
        "telegram 7, group -100": ["echo__big", "echo__echo"],
        "telegram 7, dm": ["echo__echo"],
        "discord 42": ["echo__echo", "echo__pid"],  # slow: denied on discord, whoever asks
        "agent other": ["echo__echo", "echo__environment"],
        # a job is offered only what it names (the turn is handed those), never the chats' allows;
        # the policy lets through any tool no deny refuses there (echo__die: the server's own deny)
        "cron": sorted(n for n in registry.names() if n != "echo__die"),
    }
    assert listed == ["echo__big", "echo__echo"]  # /tools: what this chat may use, no more


def test_a_rule_that_says_nothing_or_names_a_chat_badly_is_refused():
    with pytest.raises(ConfigError, match="a rule needs allow or deny"):
        config_from_dict({"tools": {"rules": [{"users": ["telegram:1"]}]}}, env={})
    with pytest.raises(ConfigError, match="chats are platform:id"):
        config_from_dict({"tools": {"rules": [{"allow": ["x__*"], "chats": ["-100"]}]}}, env={})


async def test_a_user_sees_and_can_call_only_their_tools(tmp_path, model):
    tools = {"rules": [{"allow": ["echo__pid"], "chats": ["api:ann"]}, {"allow": ["echo__echo"]}],
             "mcp_servers": {"echo": echo_server(allow=[], deny=[])}}
    model.script(ToolCall("echo__pid", {}), Reply("bob asked for a pid"))
    async with running_gateway(tmp_path, model, tools=tools) as gw:
        await _ready(gw)
        api = ApiClient(gw)
        ann_tools = await api.say("ann", "/tools")
        bob_tools = await api.say("bob", "/tools")
        await api.say("bob", "what is the pid?")
        await api.close()
    assert "echo__pid" in ann_tools and "echo__echo" in ann_tools
    assert "echo__pid" not in bob_tools and "echo__echo" in bob_tools
    first, second = model.requests[-2:]
    offered = sorted(t["function"]["name"] for t in first.body.get("tools", []) if "__" in t["function"]["name"])
    assert offered == ["echo__echo"]
    [result] = [m["content"] for m in second.messages if m.get("role") == "tool"]
    assert result.startswith("error: only the tools ") and "not 'echo__pid'" in result  # refused, never run


async def test_a_cron_job_gets_only_the_tools_it_names(tmp_path, model):
    tools = {"rules": [{"allow": ["echo__*"]}], "mcp_servers": {"echo": echo_server(allow=[], deny=[])}}
    job = {"id": "morning", "schedule": "every 1d", "prompt": "Weather?", "tools": ["echo__pid"]}
    other = {"id": "evening", "schedule": "every 1d", "prompt": "News?"}
    model.script(ToolCall("echo__echo", {"text": "not mine"}), Reply("done"), Reply("no tools for me"))
    async with running_gateway(tmp_path, model, tools=tools, cron={"jobs": [job, other]}) as gw:
        await _ready(gw)
        run = await gw.cron.run_job("morning")
        messages = await gw.db.messages.get(run["session_id"])
        await gw.cron.run_job("evening")
    morning, _, evening = model.requests[-3:]
    assert [t["function"]["name"] for t in morning.body["tools"]] == ["echo__pid"]
    assert "tools" not in evening.body  # a job that names none gets none, whatever the chats may use
    [result] = [m.content for m in messages if m.role == "tool"]
    assert result == "error: only the echo__pid tool is available now, not 'echo__echo'"


def test_a_jobs_tools_must_be_mcp_tool_globs(tmp_path):
    bad = {"id": "j", "schedule": "every 1d", "prompt": "p", "tools": ["memory"]}
    with pytest.raises(ConfigError, match="not a glob over <server>__<tool>"):
        from gateway.cron.service import config_jobs

        config_jobs(config_from_dict({"home": str(tmp_path), "cron": {"jobs": [bad]}}, env={}), now=0)


def test_tools_list_says_where_each_tool_is_offered(tmp_path):
    import json

    import yaml
    from click.testing import CliRunner

    from gateway.cli.main import main

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "tools": {
        "rules": [{"allow": ["echo__pid"], "users": ["telegram:42"]}, {"deny": ["echo__big"]}],
        "mcp_servers": {"echo": echo_server(allow=["echo__echo", "echo__big"], deny=["echo__die"])}}}))
    result = CliRunner().invoke(main, ["tools", "list", "--json", "--config", str(config)])
    assert result.exit_code == 0, result.output
    [server] = json.loads(result.stdout)
    where = {t["name"]: t["offered_in"] for t in server["tools"]}
    assert (where["echo__echo"], where["echo__pid"], where["echo__big"], where["echo__die"], where["echo__fail"]) == (
        "everywhere", "some chats", "nowhere", "nowhere", "nowhere")
