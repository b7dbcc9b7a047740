"""Fact memory through the real gateway: prefetch reaches the model and not the store, /facts on|off,
extraction when a session ends (dedup, contradictions, catch-up at start), the facts tool."""

import json
import sqlite3

import pytest

import state
from gateway.memory.facts.extract import EXTRACT_PROMPT
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.harness import ApiClient, eventually, running_gateway

FACTS = {"facts": {"extract_delay_seconds": 0}}


@pytest.fixture
def store_config(backend, store_target):
    """Config overrides putting the gateway on this test's backend: nothing for SQLite (the home's
    state.db), ``store.url`` for PostgreSQL (tests/conftest.py: ``store_target``)."""
    return {} if backend == "sqlite" else {"store": {"url": store_target}}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def extraction_requests(model):
    return [r for r in model.requests if r.messages and r.messages[0].get("content") == EXTRACT_PROMPT]


def chat_requests(model):
    return [r for r in model.requests if r.messages and r.messages[0].get("content") != EXTRACT_PROMPT]


async def until(condition, timeout: float = 10.0):
    return await eventually(condition, timeout, every=0.02)


async def test_prefetched_facts_reach_the_model_call_but_never_the_store(tmp_path, model, store_config):
    model.responder = lambda messages: "noted"  # (the default echo would repeat the block into the answer)
    async with running_gateway(tmp_path, model, **store_config, **FACTS) as gw:
        await gw.services.facts.service.remember("main", "api:ann", "Ann's favourite editor is Helix", ["helix"])
        await gw.services.facts.service.remember("main", "api:bob", "Bob's favourite editor is Emacs", ["emacs"])
        api = ApiClient(gw)
        reply = await api.say("ann", "which editor should I configure?")
        sent = model.requests[-1]
        session = await gw.db.routes.get("agent:main:api:dm:ann")
        stored = await gw.db.messages.get(session)

        assert (await api.say("ann", "/facts off")).startswith("Fact recall is off for this chat")
        await api.say("ann", "which editor again?")
        off = model.requests[-1]
        status = await api.say("ann", "/facts")
        assert (await api.say("ann", "/facts on")).startswith("Fact recall is on for this chat")
        await api.say("ann", "and the editor now?")
        on_again = model.requests[-1]
        await api.close()

    last = sent.messages[-1]
    assert last["role"] == "user" and last["content"].startswith("which editor should I configure?\n\n<memory-context>\n")
    assert "Ann's favourite editor is Helix" in last["content"] and last["content"].endswith("</memory-context>")
    assert "Emacs" not in json.dumps(sent.messages)  # another user's facts never come along
    assert "## Fact memory" in sent.messages[0]["content"]
    assert reply == "noted"
    assert [m.content for m in stored if m.role == "user"] == ["which editor should I configure?"]
    assert "memory-context" not in json.dumps([m.as_dict() for m in stored])
    assert off.messages[-1] == {"role": "user", "content": "which editor again?"}
    assert "</memory-context>" not in json.dumps(off.messages)
    assert status.startswith("1 fact(s) stored about you. Recall before each message is off in this chat (/facts on")
    assert "Ann's favourite editor is Helix" in status
    assert "<memory-context>" in on_again.messages[-1]["content"]


async def test_a_new_session_extracts_facts_once_and_a_repeat_confirms_them(tmp_path, model, store_config):
    answers = [
        {"facts": [{"text": "The user is migrating the shop to Postgres", "entities": ["postgres", "shop"]},
                   {"text": "The user's cat is called Miso", "entities": ["miso"]}], "contradicted": []},
        {"facts": [{"text": "The user is migrating the shop to Postgres.", "entities": ["postgres", "shop"]},
                   {"text": "The user's cat is now called Mochi", "entities": ["mochi"]}], "contradicted": ["MISO_ID"]},
    ]

    def responder(messages):
        if messages[0].get("content") != EXTRACT_PROMPT:
            return None
        answer = json.dumps(answers.pop(0))
        return answer.replace('"MISO_ID"', str(miso_id[0])) if miso_id else answer

    miso_id: list[int] = []
    model.responder = responder
    async with running_gateway(tmp_path, model, **store_config, **FACTS) as gw:
        api = ApiClient(gw)
        await api.say("cy", "we are moving the shop to postgres")
        await api.say("cy", "also my cat Miso says hi")
        first = await gw.db.routes.get("agent:main:api:dm:cy")
        await api.say("cy", "/new")
        await until(lambda: _extracted(gw, 1))
        stored = await gw.db.facts.list("main", "api:cy")
        miso_id.append(next(f["id"] for f in stored if "Miso" in f["content"]))
        await api.say("cy", "the postgres migration is still on")
        await api.say("cy", "and the cat is Mochi now, we renamed her")
        await api.say("cy", "/new")
        await until(lambda: _extracted(gw, 2))
        after = {f["content"]: f for f in await gw.db.facts.list("main", "api:cy", include_superseded=True)}
        extraction = await gw.db.facts.extraction(first)
        await api.say("cy", "hello")
        await api.close()

    requests = extraction_requests(model)
    assert len(requests) == 2  # one per ended session
    assert "USER: we are moving the shop to postgres" in requests[0].messages[1]["content"]
    assert f"{miso_id[0]}: The user's cat is called Miso" in requests[1].messages[1]["content"]  # shown with its id
    assert sorted(after) == ["The user is migrating the shop to Postgres", "The user's cat is called Miso",
                             "The user's cat is now called Mochi"]
    postgres = after["The user is migrating the shop to Postgres"]
    assert (postgres["trust"], postgres["confirmations"]) == (pytest.approx(0.6), 1)  # confirmed, not duplicated
    assert after["The user's cat is called Miso"]["trust"] == pytest.approx(0.25)  # contradicted
    assert extraction["added"] == 2 and extraction["confirmed"] == 0


async def _extracted(gw, n):
    return len(gw.services.facts.extracted) >= n


async def test_sessions_that_ended_while_the_daemon_was_down_are_extracted_at_start(tmp_path, model, store_config):
    db = state.SessionDB(store_config["store"]["url"] if store_config else tmp_path / "state.db")
    db.sessions.create("old-1", "api", user_id="dee", session_key="agent:main:api:dm:dee")
    for i, text in enumerate(["I run a bakery in Ghent", "Nice!", "We open at 7", "Noted."]):
        db.messages.append("old-1", "user" if i % 2 == 0 else "assistant", text)
    db.sessions.end("old-1", "idle")
    db.close()
    model.responder = lambda messages: (json.dumps({"facts": [{"text": "The user runs a bakery in Ghent",
                                                                 "entities": ["bakery", "ghent"]}]})
                                        if messages[0].get("content") == EXTRACT_PROMPT else None)
    async with running_gateway(tmp_path, model, **store_config, **FACTS) as gw:
        await until(lambda: _extracted(gw, 1))
        found = await gw.services.facts.service.search("main", "api:dee", "where is the bakery?")
    assert [f.content for f in found] == ["The user runs a bakery in Ghent"]
    assert found[0].session_id == "old-1"


async def test_a_failed_extraction_stores_nothing_and_can_run_again(tmp_path, model, store_config):
    async with running_gateway(tmp_path, model, **store_config, **FACTS) as gw:
        api = ApiClient(gw)
        await api.say("eve", "I prefer tea")
        await api.say("eve", "green tea, mostly")
        sid = await gw.db.routes.get("agent:main:api:dm:eve")
        await api.say("eve", "/new")  # the default echo is no JSON: the extraction fails
        await until(lambda: _extracted(gw, 1))
        await api.close()
        assert gw.services.facts.extracted[-1].skipped.startswith("failed: the answer holds no JSON object")
        assert await gw.db.facts.extraction(sid) is None  # the claim was given back
        assert await gw.db.facts.list("main", "api:eve") == []


async def test_the_model_stores_and_finds_facts_with_the_tool(tmp_path, model, store_config):
    model.script(ToolCall("facts", {"action": "add", "content": "Fay's server is called atlas", "entities": ["atlas"]}),
                 Reply("stored"),
                 ToolCall("facts", {"action": "search", "query": "what is the server called?"}, call_id="c2"),
                 Reply("it is atlas"),
                 ToolCall("facts", {"action": "search", "query": "server", "mode": "telepathy"}, call_id="c3"),
                 Reply("bad mode"))
    async with running_gateway(tmp_path, model, **store_config, **FACTS) as gw:
        api = ApiClient(gw)
        assert await api.say("fay", "remember my server is called atlas") == "stored"
        assert await api.say("fay", "what's my server called?") == "it is atlas"
        await api.say("fay", "try telepathy")
        await api.close()
    tool_results = [m for r in model.requests for m in r.messages if m.get("role") == "tool"]
    results = list(dict.fromkeys(m["content"] for m in tool_results))
    assert results[0].startswith("Stored as #1.")
    assert results[1].startswith("Facts (probe), best first:\n#1 (trust 0.70, confirmed ")
    assert results[1].endswith(") Fay's server is called atlas")
    assert results[2] == "error: unknown mode 'telepathy'; use one of probe, related, reason, contradict"


async def test_a_compressed_session_is_extracted_after_the_turn_that_compressed_it(tmp_path, model, store_config):
    long = "details about the migration plan, the staging database and the rollback steps. " * 4
    answer = json.dumps({"facts": [{"text": "The user plans a staging database migration", "entities": ["staging"]}]})

    def responder(messages):
        first = messages[0].get("content") or ""
        return answer if first == EXTRACT_PROMPT else "SUMMARY: migration plan" if "summar" in first.lower() else None

    model.responder = responder
    async with running_gateway(tmp_path, model, **store_config, model={"context_length": 4096}, **FACTS) as gw:
        api = ApiClient(gw)
        for i in range(7):
            await api.say("gus", f"turn {i}: {long}")
        root = await gw.db.routes.get("agent:main:api:dm:gus")
        reply = await api.say("gus", "/compress")
        await until(lambda: _extracted(gw, 1))
        await api.close()
        facts = await gw.db.facts.list("main", "api:gus")
    assert reply.startswith("Compressed: ")
    assert gw.services.facts.extracted[0].session_id == root and gw.services.facts.extracted[0].added == 1
    assert [f["content"] for f in facts] == ["The user plans a staging database migration"]
    assert facts[0]["session_id"] == root


async def test_a_broken_fact_index_costs_the_prefetch_never_the_answer(tmp_path, model, caplog):
    async with running_gateway(tmp_path, model, **FACTS) as gw:
        await gw.services.facts.service.remember("main", "api:ida", "Ida's favourite tea is sencha", ["sencha"])
        conn = sqlite3.connect(gw.config.db_path)
        conn.execute("DROP TABLE facts_fts")  # damage the index under the running daemon
        conn.commit()
        conn.close()
        api = ApiClient(gw)
        reply = await api.say("ida", "which tea do I like?")
        await api.close()
    assert reply.startswith("echo: which tea do I like?")
    assert model.requests[-1].messages[-1] == {"role": "user", "content": "which tea do I like?"}
    assert "fact prefetch for agent:main:api:dm:ida failed; answering without it" in caplog.text
