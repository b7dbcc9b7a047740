"""Cross-session recall: the session_search tool and /search, through the real gateway and fake model."""

import datetime as dt
import json
import re
import sqlite3
from contextlib import closing

import pytest

from gateway.memory.identity import recall_scope
from gateway.memory.recall import RecallSettings, SessionRecall
from gateway.tools import ToolContext
from tests.fakes.model_server import Fail, FakeModel, ToolCall
from tests.harness import ApiClient, gateway_config, running_gateway

AGENT = "agent:main"


def summarizer(messages: list[dict]) -> str | None:
    """The fake model's answers: summaries name the conversation they read; a turn after a
    tool call repeats the tool's result, so the test sees what the model was given."""
    last = messages[-1]
    if last.get("role") == "tool":
        return f"tool said: {last['content']}"
    text = last.get("content") or ""
    if isinstance(text, str) and text.startswith("Summarize this conversation excerpt."):
        focus = re.search(r"Focus on content related to: (.*)", text).group(1)
        header = re.search(r"Conversation \((.*?), .* on (\w+)\):", text)
        return f"SUMMARY[{focus}] of {header.group(1)} on {header.group(2)}: {len(text)} chars read"
    return None


@pytest.fixture
def store_config(backend, store_target):
    """Config overrides putting the gateway on this test's backend: nothing for SQLite (the home's
    state.db), ``store.url`` for PostgreSQL (tests/conftest.py: ``store_target``)."""
    return {} if backend == "sqlite" else {"store": {"url": store_target}}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        fake.responder = summarizer
        yield fake


async def seed(db, sid, platform, user, lines, *, title=None, agent="main", parent=None, started=None):
    await db.sessions.create(sid, platform, model="m", user_id=user, session_key=f"agent:{agent}:{platform}:dm:{user}",
                            parent_session_id=parent, title=title)
    for i, text in enumerate(lines):
        await db.messages.append(sid, "user" if i % 2 == 0 else "assistant", text,
                                timestamp=(started or 1_700_000_000.0) + i)


def when(ts: float) -> str:
    return f"{dt.datetime.fromtimestamp(ts, dt.timezone.utc):%d %b %Y %H:%M}"


def summary_requests(model) -> list:
    return [r for r in model.requests if r.last_user_text.startswith("Summarize this conversation excerpt.")]


async def test_the_model_recalls_an_older_session_through_the_tool(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "old-docker", "api", "alice", [
            "my docker container keeps restarting", "run docker logs web-1 and check the exit code",
            "exit code 137, out of memory", "raise the memory limit to 2g in compose.yaml"], title="Docker trouble")
        await seed(gw.db, "old-other", "api", "alice", ["what should I cook tonight", "try a risotto"])
        model.script(ToolCall("session_search", {"query": "docker restarting"}))
        api = ApiClient(gw)
        answer = await api.say("alice", "like we discussed last week, what was the docker fix?")
        await api.close()
        current = await gw.db.routes.get("agent:main:api:dm:alice")
        stored = await gw.db.messages.get(current)
        day = when((await gw.db.sessions.get("old-docker")).started_at)
    assert answer.startswith("tool said: Earlier conversations about \"docker restarting\" (1):")
    assert f'1. "Docker trouble" · {day} · api · session old-docker · 1 matching message' in answer
    assert "SUMMARY[docker restarting] of \"Docker trouble\" on api" in answer
    # the summarizer read the whole (short) conversation
    (req,) = summary_requests(model)
    assert "raise the memory limit to 2g in compose.yaml" in req.last_user_text
    assert "past tense" in req.last_user_text and "file paths" in req.last_user_text
    # the loop: tool call, tool result, final answer, all stored in the session
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls[0]["function"]["name"] == "session_search"


async def test_the_current_lineage_is_excluded(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        # ancestor -> current -> child is one conversation (compression, delegation); "unrelated" is another
        await seed(gw.db, "ancestor", "api", "bob", ["zebra notes, part one", "ok"])
        await seed(gw.db, "current", "api", "bob", ["zebra notes, part two", "ok"], parent="ancestor")
        await seed(gw.db, "child", "api", "bob", ["zebra notes, part three", "ok"], parent="current")
        await seed(gw.db, "unrelated", "api", "bob", ["zebra crossing design review", "noted"], title="Crossings")
        scope = recall_scope(gw.config, "main", "api", "bob")
        from_current = await gw.services.recall.gather("zebra", scope, current_session_id="current")
        from_child = await gw.services.recall.gather("zebra", scope, current_session_id="child")
        from_nowhere = await gw.services.recall.gather("zebra", scope)
    assert [f.session_id for f in from_current] == ["unrelated"]
    assert [f.session_id for f in from_child] == ["unrelated"]
    assert len(from_nowhere) == 3  # with no current session, any 3 of the 4


async def test_a_user_never_sees_another_users_or_agents_sessions(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "alice-1", "api", "alice", ["the secret launch code is walrus", "noted"])
        await seed(gw.db, "bob-other-agent", "api", "bob", ["walrus facts", "ok"], agent="other")
        await seed(gw.db, "bob-telegram", "telegram", "bob", ["walrus on telegram", "ok"])
        model.script(ToolCall("session_search", {"query": "walrus"}))
        api = ApiClient(gw)
        answer = await api.say("bob", "what did we say about walrus?")
        slash = await api.say("bob", "/search walrus")
        recent = await api.say("bob", "/search")
        await api.close()
    # bob's api account is not linked to his telegram one, and the other agent's session is not his to see
    assert answer == 'tool said: No earlier conversation matches "walrus". Try other words, fewer words, or a prefix like deploy*.'
    assert slash == 'No earlier conversation matches "walrus". Try other words, fewer words, or a prefix like deploy*.'
    assert "alice-1" not in recent and "bob-other-agent" not in recent and "bob-telegram" not in recent
    assert summary_requests(model) == []


async def test_linked_accounts_and_the_operator(tmp_path, model, store_config):
    identities = {"alice": ["telegram:123", "discord:456"], "ops": ["slack:UOPS"]}
    async with running_gateway(tmp_path, model, **store_config, identities=identities, auth={"owner": "ops"}) as gw:
        await seed(gw.db, "alice-discord", "discord", "456", ["the quokka deploy failed on friday", "rolled back"],
                   title="Quokka deploy")
        await seed(gw.db, "mallory", "discord", "999", ["quokka quokka quokka", "ok"])
        await seed(gw.db, "other-agent", "telegram", "123", ["quokka elsewhere", "ok"], agent="second")

        async def search(platform, user):
            ctx = ToolContext(session_id="none", session_key=f"agent:main:{platform}:dm:{user}", platform=platform,
                              user_id=user, agent="main")
            return await gw.tools.call("session_search", json.dumps({"query": "quokka"}), ctx)

        from_alice = await search("telegram", "123")
        from_root = await search("slack", "UOPS")
        from_stranger = await search("slack", "UNKNOWN")
    # Alice finds her Discord conversation from Telegram, and only hers
    assert from_alice.startswith('Earlier conversations about "quokka" (1):\n\n1. "Quokka deploy" ·')
    assert "· discord · session alice-discord" in from_alice
    # the operator sees everything, other agents' sessions included
    assert from_root.startswith('Earlier conversations about "quokka" (3):')
    assert all(sid in from_root for sid in ("alice-discord", "mallory", "other-agent"))
    assert from_stranger.startswith("No earlier conversation matches")


async def test_the_snippets_stand_in_when_the_summarizer_fails(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "s1", "api", "carol", ["the capybara server is down", "restart capybara with systemctl"])
        model.script(Fail(status=400, message="bad request"))
        api = ApiClient(gw)
        answer = await api.say("carol", "/search capybara")
        await api.close()
    assert answer.splitlines()[3:] == [
        "(No summary available; the matching lines:)",
        "- restart >>>capybara<<< with systemctl",
        "- the >>>capybara<<< server is down",
    ]


async def test_at_most_three_summaries_in_flight_and_five_sessions(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        for n in range(7):
            await seed(gw.db, f"s{n}", "api", "dave", [f"ocelot notes {n}", "ocelot " * (n + 1)], started=1_700_000_000 + n)
        model.delay = 0.5
        model.script(ToolCall("session_search", {"query": "ocelot", "limit": 9}))
        api = ApiClient(gw)
        answer = await api.say("dave", "find the ocelot talks")
        await api.close()
    assert answer.startswith('tool said: Earlier conversations about "ocelot" (5):')
    assert len(summary_requests(model)) == 5
    assert model.max_in_flight == 3


async def test_empty_query_lists_recent_sessions_without_the_model(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "e1", "api", "erin", ["plan the garden", "sure"], title="Garden", started=1_700_000_000)
        await seed(gw.db, "e2", "api", "erin", ["tax questions", "ok"], started=1_700_100_000)
        model.script(ToolCall("session_search", {"query": ""}))
        api = ApiClient(gw)
        answer = await api.say("erin", "what have we talked about?")
        await api.close()
        days = [when((await gw.db.sessions.get(sid)).last_active) for sid in ("e1", "e2")]
    lines = answer.splitlines()
    assert lines[0] == "tool said: Recent sessions:"
    assert lines[1] == f"1. (untitled) · {days[1]} · api · 2 messages · session e2 · “tax questions”"
    assert lines[2] == f'2. "Garden" · {days[0]} · api · 2 messages · session e1 · “plan the garden”'
    assert len(lines) == 3  # the current session is not listed
    assert summary_requests(model) == []


async def test_bad_role_filter_is_explained(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        model.script(ToolCall("session_search", {"query": "x", "role_filter": "user,wizard"}))
        api = ApiClient(gw)
        answer = await api.say("fay", "search please")
        await api.close()
    assert answer == ("tool said: error: unknown role(s) wizard; role_filter takes a comma-separated list of "
                      "user, assistant, tool, system")


async def test_role_filter_and_cjk_queries(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "zh", "api", "gus", ["数据库迁移失败了", "先备份数据库再重试"])
        await seed(gw.db, "en", "api", "gus", ["hello", "the heron answer is here"])
        scope = recall_scope(gw.config, "main", "api", "gus")
        cjk = await gw.services.recall.gather("数据库", scope)
        only_users = await gw.services.recall.gather("heron", scope, role_filter=["user"])
        assistants = await gw.services.recall.gather("heron", scope, role_filter=["assistant"])
    assert [(f.session_id, f.hits) for f in cjk] == [("zh", 2)]
    assert only_users == []
    assert [f.session_id for f in assistants] == ["en"]


async def test_a_summary_that_runs_late_falls_back_to_snippets(tmp_path, model, store_config):
    cfg = gateway_config(tmp_path, model.base_url, **store_config)
    import state
    from gateway.model import ModelClient, ModelSettings

    db = await state.AsyncSessionDB.open(cfg.store_target)
    client = ModelClient(ModelSettings(base_url=model.base_url, api_key="k", name="fake-model", timeout_seconds=30,
                                       max_concurrent_calls=8, max_retries=0, retry_total_seconds=5))
    try:
        await seed(db, "slow", "api", "hal", ["the narwhal report", "done"])
        model.delay = 3.0
        recall = SessionRecall(db, client, RecallSettings(timeout_seconds=0.2))
        found = await recall.search("narwhal", recall_scope(cfg, "main", "api", "hal"))
    finally:
        await client.close()
        await db.close()
    assert [(f.session_id, f.summary, f.snippets) for f in found] == [("slow", None, ("the >>>narwhal<<< report",))]


async def test_the_summarizer_model_is_configurable(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config, recall={"model": "tiny-summarizer"}) as gw:
        await seed(gw.db, "m1", "api", "ivy", ["the axolotl tank", "ok"])
        api = ApiClient(gw)
        await api.say("ivy", "/search axolotl")
        await api.close()
    (req,) = summary_requests(model)
    assert req.body["model"] == "tiny-summarizer"
    assert json.dumps(req.body).count("axolotl") >= 2


@pytest.mark.sqlite_only("FTS5's index batches")
async def test_indexed_and_just_appended_messages_are_both_found(tmp_path, model, store_config):
    # the index takes appended messages in batches of 32: a search sees both the indexed and the pending ones
    async with running_gateway(tmp_path, model, **store_config) as gw:
        lines = ["filler words"] * 80
        lines[2], lines[78] = "the pelican migration started", "the pelican migration finished"
        lines[4], lines[76] = "数据库迁移开始", "数据库迁移结束"
        await seed(gw.db, "noise", "api", "someone-else", ["pelican pelican", "数据库"] * 15)
        await seed(gw.db, "big", "api", "pat", lines)  # ids 31-110: up to 96 indexed, the last 14 pending
        with closing(sqlite3.connect(f"file:{gw.config.db_path}?mode=ro", uri=True)) as conn:
            assert conn.execute("SELECT indexed_upto FROM search_index_state").fetchone()[0] == 96
        scope = recall_scope(gw.config, "main", "api", "pat")
        english = await gw.services.recall.gather("pelican migration", scope)
        cjk = await gw.services.recall.gather("数据库", scope)
        negated = await gw.services.recall.gather("pelican NOT finished", scope)
    assert [(f.session_id, f.hits) for f in english] == [("big", 2)]
    assert english[0].snippets == ("the >>>pelican<<< >>>migration<<< finished", "the >>>pelican<<< >>>migration<<< started")
    assert [(f.session_id, f.hits) for f in cjk] == [("big", 2)]
    assert [(f.session_id, f.hits) for f in negated] == [("big", 1)]


async def test_a_compressed_conversation_is_recalled_as_one(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config) as gw:
        await seed(gw.db, "part1", "api", "quinn", ["the lighthouse budget is 40k", "noted"], title="Lighthouse")
        await gw.db.sessions.end("part1", "compression")
        await seed(gw.db, "part2", "api", "quinn", ["lighthouse budget raised to 55k", "ok"], parent="part1",
                   title="Lighthouse #2")
        await seed(gw.db, "other", "api", "quinn", ["a lighthouse photo", "nice"])
        scope = recall_scope(gw.config, "main", "api", "quinn")
        found = await gw.services.recall.gather("lighthouse budget", scope)
    assert [(f.session_id, f.title, f.hits) for f in found] == [("part2", "Lighthouse #2", 2)]
    text = found[0].text
    assert text.index("the lighthouse budget is 40k") < text.index("[... the conversation was compressed here")
    assert text.index("[... the conversation was compressed here") < text.index("lighthouse budget raised to 55k")
