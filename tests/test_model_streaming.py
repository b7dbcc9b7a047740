"""The model called with ``stream=True`` through the openai SDK, against the fake model's Server-Sent Events."""

from __future__ import annotations

import json

import pytest

from gateway.errors import AnswerCutOff, ModelUnavailable
from gateway.model import ModelClient, ModelSettings
from gateway.retry import Backoff
from tests.fakes.model_server import CutOff, Fail, FakeModel, ReasoningToolCall, Reply, ToolCall


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        fake.stream_chunk_chars = 5
        yield fake


@pytest.fixture
async def client(model):
    c = ModelClient(ModelSettings(base_url=model.base_url, api_key="k", name="fake-model", max_retries=2,
                                  retry_total_seconds=5), backoff=Backoff(base=0.01, cap=0.05))
    yield c
    await c.close()


async def test_text_arrives_in_pieces_and_the_completion_is_the_whole_answer(model, client):
    model.script(Reply("The whole answer, streamed a few characters at a time."))
    pieces: list[str] = []
    completion = await client.complete([{"role": "user", "content": "hi"}], on_text=pieces.append)
    assert len(pieces) > 5 and "".join(pieces) == "The whole answer, streamed a few characters at a time."
    assert completion.message == {"role": "assistant", "content": "".join(pieces)}
    assert completion.finish_reason == "stop"
    assert completion.completion_tokens > 0 and completion.prompt_tokens > 0, "usage from the last chunk"
    [request] = model.requests
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}


async def test_a_tool_call_is_put_together_from_its_deltas_and_shows_no_text(model, client):
    model.script(ToolCall("session_search", {"query": "what did we decide about postgres", "limit": 3}))
    pieces: list[str] = []
    completion = await client.complete([{"role": "user", "content": "hi"}], on_text=pieces.append,
                                       tools=[{"type": "function", "function": {"name": "session_search"}}])
    assert pieces == []
    [call] = completion.message["tool_calls"]
    assert call["id"] == "call_1" and call["function"]["name"] == "session_search"
    assert json.loads(call["function"]["arguments"]) == {"query": "what did we decide about postgres", "limit": 3}
    assert completion.finish_reason == "tool_calls"


async def test_streamed_reasoning_is_kept_for_the_tool_loop(model, client):
    behaviour = ReasoningToolCall("session_search", {"query": "x"})
    model.script(behaviour)
    completion = await client.complete([{"role": "user", "content": "hi"}], on_text=lambda _: None)
    for key, value in behaviour.reasoning.items():
        assert completion.message[key] == value


async def test_a_failure_before_any_text_is_retried(model, client):
    model.script(Fail(503), Reply("second time lucky"))
    pieces: list[str] = []
    completion = await client.complete([{"role": "user", "content": "hi"}], on_text=pieces.append)
    assert "".join(pieces) == completion.message["content"] == "second time lucky"
    assert len(model.requests) == 2


async def test_a_stream_that_breaks_off_after_text_says_so_with_the_partial_text(model, client):
    model.script(CutOff("This answer will not make it to the end of the sentence.", after=20))
    pieces: list[str] = []
    with pytest.raises(AnswerCutOff) as cut:
        await client.complete([{"role": "user", "content": "hi"}], on_text=pieces.append)
    assert cut.value.partial == "".join(pieces) == "This answer will not"
    assert isinstance(cut.value, ModelUnavailable)
    assert len(model.requests) == 1, "text was shown: not retried (it would show twice)"
