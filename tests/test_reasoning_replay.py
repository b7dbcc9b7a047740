"""A model's reasoning is stored, read back exactly, and sent back as ``model.replay_reasoning`` says."""

from __future__ import annotations

import pytest
from fakes.model_server import FakeModel, ReasoningToolCall, Reply
from harness import ApiClient, running_gateway

from state import SessionDB

DETAILS = [{"type": "reasoning.encrypted", "data": "gAAAA-opaque", "id": "rs_1", "index": 0},
           {"type": "reasoning.summary", "summary": "Looked it up. 记忆", "nested": {"n": 1.5, "ok": True, "none": None}}]


def test_the_conversation_gives_back_stored_reasoning_exactly(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.sessions.create("s", "cli")
        db.messages.append("s", "user", "hi")
        call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        db.messages.append("s", "assistant", None, tool_calls=call, reasoning="think", reasoning_details=DETAILS,
                          codex_reasoning_items=[{"type": "reasoning", "encrypted_content": "x"}])
        db.messages.append("s", "tool", "result", tool_call_id="c1", tool_name="f")
        db.messages.append("s", "assistant", "empty reasoning", reasoning="", reasoning_details="",
                          codex_reasoning_items=[])
        db.messages.append("s", "assistant", "a JSON string stays a string", reasoning_details="[1, 2]")
        db.messages.append("s", "assistant", "no reasoning")
        conversation = db.messages.as_conversation("s")
    assert conversation == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": call, "reasoning": "think", "reasoning_content": "think",
         "reasoning_details": DETAILS, "codex_reasoning_items": [{"type": "reasoning", "encrypted_content": "x"}]},
        {"role": "tool", "content": "result", "tool_call_id": "c1", "tool_name": "f"},
        {"role": "assistant", "content": "empty reasoning", "reasoning": "", "reasoning_content": "",
         "reasoning_details": "", "codex_reasoning_items": []},
        {"role": "assistant", "content": "a JSON string stays a string", "reasoning_details": "[1, 2]"},
        {"role": "assistant", "content": "no reasoning"},
    ]


def test_reasoning_content_is_stored_as_the_reasoning(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.sessions.create("s", "cli")
        db.messages.record_turn("s", [{"role": "assistant", "content": "a", "reasoning_content": "deepseek style"}])
        (message,) = db.messages.as_conversation("s")
        stored = db.messages.get("s")[0].reasoning
    assert message["reasoning_content"] == message["reasoning"] == stored == "deepseek style"


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def _assistant_with_call(request) -> dict:
    return next(m for m in request.messages if m["role"] == "assistant" and m.get("tool_calls"))


async def test_the_tool_loop_sends_the_reasoning_back_and_later_turns_do_not(tmp_path, model):
    reasoning = ReasoningToolCall("session_search", {"query": "deploy"}).reasoning
    model.script(ReasoningToolCall("session_search", {"query": "deploy"}), Reply("found nothing"))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        # the fake fails the tool loop's second request when the reasoning did not come back
        assert await api.say("kim", "did we talk about deploys?") == "found nothing"
        assert (await api.say("kim", "thanks")).startswith("echo: thanks")
        (session,) = await gw.db.sessions.list_rich(source="api", limit=5)
        stored = await gw.db.messages.get(session["id"])
        await api.close()
    loop_request, next_turn = model.requests[1], model.requests[2]
    assert {k: _assistant_with_call(loop_request).get(k) for k in reasoning} == reasoning
    # stored with the tool call...
    call_row = next(m for m in stored if m.role == "assistant" and m.tool_calls)
    assert (call_row.reasoning, call_row.reasoning_details) == (reasoning["reasoning"], reasoning["reasoning_details"])
    # ... but not replayed in the next turn (model.replay_reasoning: tool_loop)
    replayed = _assistant_with_call(next_turn)
    assert not {"reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items"} & set(replayed)


async def test_always_replays_the_reasoning_in_later_turns(tmp_path, model):
    reasoning = ReasoningToolCall("session_search", {"query": "x"}).reasoning
    model.script(ReasoningToolCall("session_search", {"query": "x"}), Reply("ok"))
    async with running_gateway(tmp_path, model, model={"replay_reasoning": "always"}) as gw:
        api = ApiClient(gw)
        assert await api.say("kim", "look it up") == "ok"
        await api.say("kim", "and now?")
        await api.close()
    replayed = _assistant_with_call(model.requests[2])
    assert replayed["reasoning_details"] == reasoning["reasoning_details"]
    assert replayed["reasoning"] == replayed["reasoning_content"] == reasoning["reasoning"]


async def test_never_sends_no_reasoning_even_within_the_tool_loop(tmp_path, model):
    model.script(ReasoningToolCall("session_search", {"query": "x"}), Reply("ok"))
    async with running_gateway(tmp_path, model, model={"replay_reasoning": "never"}) as gw:
        api = ApiClient(gw)
        assert (await api.failure("kim", "look it up"))[0] == 503  # this fake model then refuses it, as such do
        await api.close()
    sent = _assistant_with_call(model.requests[1])
    assert not {"reasoning", "reasoning_details"} & set(sent)
