"""The local API as an OpenAI-compatible endpoint: streamed answers, usage and /v1/models, with the
openai SDK as the client, against the real gateway and the fake model."""

import asyncio
import json
import time

import aiohttp
import openai
import pytest

from gateway.turn import CUT_OFF_NOTE
from tests.fakes.model_server import CutOff, Fail, FakeModel, Hang, Reply, ToolCall
from tests.harness import ApiClient, Clock, eventually, running_gateway

LONG = ("Streaming shows the answer as the model writes it, so a long reply does not keep the user "
        "waiting in front of an empty screen for half a minute.")


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def completion_tokens(text: str) -> int:
    return len(text) // 4 + 1  # what the fake model reports


async def stream(api: ApiClient, key: str, text: str, *, include_usage: bool = False,
                 headers: dict | None = None) -> list:
    """Every chunk of one streamed request, each with the time it arrived."""
    chunks = []
    response = await api.client.chat.completions.create(
        model="switchboard", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True} if include_usage else None,
        extra_headers={"X-Session-Key": key, **(headers or {})})
    async for chunk in response:
        chunks.append((time.monotonic(), chunk))
    return chunks


def content(chunks: list) -> str:
    return "".join(c.choices[0].delta.content or "" for _, c in chunks if c.choices)


async def test_a_streamed_answer_comes_in_chunks_as_the_model_writes_with_usage_last(tmp_path, model):
    model.script(Reply(LONG, prompt_tokens=321))
    model.stream_chunk_chars, model.stream_interval = 10, 0.05  # about 0.7 s for LONG
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        chunks = await stream(api, "k", "tell me about streaming", include_usage=True)
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    objects = [c for _, c in chunks]
    assert {c.object for c in objects} == {"chat.completion.chunk"}
    assert len({c.id for c in objects}) == 1 and objects[0].id.startswith("chatcmpl-")
    assert objects[0].choices[0].delta.role == "assistant"
    assert content(chunks) == LONG
    texts = [c for c in objects if c.choices and c.choices[0].delta.content]
    assert len(texts) > 5  # piece by piece, not the whole answer at once
    # the first text reached the client while the model was still writing
    first_text_at = next(at for at, c in chunks if c.choices and c.choices[0].delta.content)
    assert first_text_at < model.requests[0].answered - 0.3
    finishes = [(i, c.choices[0].finish_reason) for i, c in enumerate(objects) if c.choices and c.choices[0].finish_reason]
    assert finishes == [(len(objects) - 2, "stop")]
    last = objects[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        321, completion_tokens(LONG), 321 + completion_tokens(LONG))
    assert [(m.role, m.content) for m in stored] == [("user", "tell me about streaming"), ("assistant", LONG)]


async def test_without_include_usage_no_usage_chunk_and_a_conversation_goes_on(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        first = await stream(api, "k", "hello")
        second = await stream(api, "k", "again")
        await api.close()
    assert all(c.choices and c.usage is None for _, c in first)
    assert content(first) == "echo: hello | turns: 1 | first: hello"
    assert content(second) == "echo: again | turns: 2 | first: hello"


async def test_a_reset_notice_is_a_header_and_a_comment_never_content(tmp_path, model):
    clock = Clock()
    async with running_gateway(tmp_path, model, clock=clock,
                               sessions={"reset": {"mode": "idle", "idle_minutes": 60}}) as gw:
        api = ApiClient(gw)
        await stream(api, "k", "before the break")
        old = await gw.db.routes.get("agent:main:api:dm:k")
        clock.advance(61 * 60)
        url = f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"
        body = {"model": "x", "messages": [{"role": "user", "content": "back again"}], "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body, headers={"X-Session-Key": "k"}) as r:
                header = r.headers["X-Switchboard-Notice"]
                raw = (await r.read()).decode()
        await api.close()
    notice = f"(Started a new session: the previous one was idle for more than 1 h. Send /resume {old} to go back.)"
    # a header and an SSE comment, never content
    assert header == notice
    assert f": notice: {notice}\n\n" in raw
    chunks = [json.loads(line.removeprefix("data: ")) for line in raw.split("\n\n") if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == \
        "echo: back again | turns: 1 | first: back again"


async def test_a_plain_answer_carries_the_real_token_usage(tmp_path, model):
    model.script(Reply("a short answer", prompt_tokens=1234))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        resp = await api.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Session-Key": "k"})
        await api.close()
    assert resp.choices[0].message.content == "a short answer"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        1234, completion_tokens("a short answer"), 1234 + completion_tokens("a short answer"))


async def test_models_lists_the_configured_model(tmp_path, model):
    async with running_gateway(tmp_path, model, model={"name": "my-model-7b"}) as gw:
        api = ApiClient(gw)
        listed = [m.id async for m in api.client.models.list()]
        await api.close()
    assert listed == ["my-model-7b"]


async def test_a_tool_status_is_a_comment_not_content_and_the_usage_counts_the_whole_turn(tmp_path, model):
    model.script(ToolCall("session_search", {"query": "deployment"}), Reply("found nothing", prompt_tokens=50))
    async with running_gateway(tmp_path, model) as gw:
        url = f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"
        body = {"model": "x", "messages": [{"role": "user", "content": "what did we deploy?"}], "stream": True,
                "stream_options": {"include_usage": True}}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body, headers={"X-Session-Key": "k"}) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                raw = (await r.read()).decode()
    assert ": searching past sessions…\n\n" in raw
    assert raw.endswith("data: [DONE]\n\n")
    chunks = [json.loads(line.removeprefix("data: ")) for line in raw.split("\n\n") if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "found nothing"
    # prompt: the answering call's; completion: both calls' (the tool call, then the answer)
    assert chunks[-1]["usage"] == {"prompt_tokens": 50, "completion_tokens": 1 + completion_tokens("found nothing"),
                                   "total_tokens": 51 + completion_tokens("found nothing")}


async def test_a_client_that_leaves_mid_stream_does_not_stop_the_turn(tmp_path, model):
    model.script(Reply(LONG))
    model.stream_chunk_chars, model.stream_interval = 10, 0.1
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        response = await api.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "long one"}], stream=True,
            extra_headers={"X-Session-Key": "k"})
        async for chunk in response:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await response.close()  # the client hangs up after the first text
        assert model.requests[0].answered is None  # while the model is still writing

        async def answered() -> bool:
            stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
            return [(m.role, m.content) for m in stored] == [("user", "long one"), ("assistant", LONG)]

        await eventually(answered, what="the whole answer stored")
        assert await api.say("k", "next") == "echo: next | turns: 2 | first: long one"
        await api.close()


async def test_a_retried_streamed_request_gets_the_stored_answer_as_one_chunk(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        key = {"Idempotency-Key": "evt-1"}
        first = await stream(api, "k", "once", headers=key, include_usage=True)
        again = await stream(api, "k", "once", headers=key, include_usage=True)
        plain = await api.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "once"}],
            extra_headers={"X-Session-Key": "k", **key})
        await api.close()
    answer = "echo: once | turns: 1 | first: once"
    assert content(first) == content(again) == plain.choices[0].message.content == answer
    assert [c.choices[0].delta.content for _, c in again if c.choices and c.choices[0].delta.content] == [answer]
    assert first[0][1].id == again[0][1].id == plain.id
    assert again[-1][1].usage.total_tokens == 0  # no model call answered the retry
    assert len(model.requests) == 1


async def test_a_stream_cut_off_mid_answer_ends_with_the_partial_and_the_note(tmp_path, model):
    model.script(CutOff(LONG, after=40))
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        chunks = await stream(api, "k", "go")
        await api.close()
    text = content(chunks)
    assert text == f"{LONG[:40]}\n\n{CUT_OFF_NOTE}"
    assert chunks[-1][1].choices[0].finish_reason == "stop"


async def test_a_model_failure_before_the_stream_began_is_an_http_error(tmp_path, model):
    model.script(*[Fail(503)] * 4)  # max_retries=3: four attempts, all fail
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        with pytest.raises(openai.APIStatusError) as failed:
            await stream(api, "k", "first question")
        await api.close()
    assert failed.value.status_code == 503 and failed.value.code == "model_unavailable"


async def test_a_model_failure_after_the_stream_began_is_an_error_event_the_sdk_raises(tmp_path, model):
    # the tool's status line starts the stream; then every call fails
    model.script(ToolCall("session_search", {"query": "x"}), *[Fail(503)] * 4)
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        with pytest.raises(openai.APIError) as failed:
            await stream(api, "k", "first question")
        await api.close()
        stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:k"))
    assert failed.value.message.startswith("The model is unavailable right now (HTTP 503)")
    assert [(m.role, m.content) for m in stored] == [("user", "first question")]  # kept, unanswered


async def test_a_stream_cut_off_by_shutdown_ends_with_an_error_the_sdk_raises(tmp_path, model):
    from gateway.runtime.daemon import Gateway
    from tests.harness import gateway_config

    model.script(Hang(30))
    gw = Gateway(gateway_config(tmp_path, model.base_url))
    await gw.start()
    api = ApiClient(gw)
    pending = asyncio.create_task(stream(api, "k", "a very long question"))
    await model.wait_for_requests(1)
    await gw.stop(grace_seconds=0.3)
    with pytest.raises(openai.APIError) as cut:
        await pending
    await api.close()
    assert "stopped before answering; your message is saved" in cut.value.message


async def test_bad_stream_fields_are_400s_naming_them(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        url = f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"
        messages = [{"role": "user", "content": "x"}]
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"messages": messages, "stream": "yes"},
                                 headers={"X-Session-Key": "k"}) as r:
                assert r.status == 400 and "'stream'" in (await r.json())["error"]["message"]
            async with http.post(url, json={"messages": messages, "stream": True, "stream_options": ["usage"]},
                                 headers={"X-Session-Key": "k"}) as r:
                assert r.status == 400 and "'stream_options'" in (await r.json())["error"]["message"]
    assert model.requests == []
