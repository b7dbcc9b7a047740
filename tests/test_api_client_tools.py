"""A client's own tools over the local API, with the real openai SDK and langchain-openai: offered to
the model beside the agent's, their calls returned with ``finish_reason: "tool_calls"`` (plain and
streamed), and the client's results continuing the turn, nothing asked or stored twice."""

import asyncio
import json

import openai
import pytest
from langchain_core.tools import tool as lc_tool
from langchain_openai import ChatOpenAI

from state.memory_fence import MEMORY_CLOSE, MEMORY_OPEN
from tests.fakes.model_server import FakeModel, ToolCall, ToolCalls
from tests.harness import running_gateway

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def base_url(gw) -> str:
    return f"http://127.0.0.1:{gw.api.bound_port}/v1"


def offered(record) -> list[str]:
    return [t["function"]["name"] for t in record.body.get("tools") or []]


async def stored(gw, session_id: str) -> list[tuple]:
    return [(m.role, m.content, [c["id"] for c in m.tool_calls or []] or m.tool_call_id)
            for m in await gw.db.messages.get(session_id)]


async def test_a_client_tool_call_comes_back_and_its_result_continues_the_turn(tmp_path, model):
    model.script(ToolCall("get_weather", {"city": "Lyon"}, call_id="call_w1"))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        history: list[dict] = [{"role": "user", "content": "weather in Lyon?"}]
        first = await client.chat.completions.with_raw_response.create(
            model="m", messages=history, tools=[WEATHER], tool_choice="auto")
        called = first.parse().choices[0]
        history.append(called.message.model_dump(exclude_none=True))
        history.append({"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 24 C"})
        second = await client.chat.completions.with_raw_response.create(model="m", messages=history, tools=[WEATHER])
        answer = second.parse().choices[0]
        await client.close()
        session_id = first.headers["X-Switchboard-Session"]
        assert second.headers["X-Switchboard-Session"] == session_id  # the same conversation
        rows = await stored(gw, session_id)
    assert called.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in called.message.tool_calls] == \
        [("call_w1", "get_weather", {"city": "Lyon"})]
    assert answer.finish_reason == "stop"
    assert answer.message.content == "echo: weather in Lyon? | turns: 1 | first: weather in Lyon?"
    assert len(model.requests) == 2  # the question was not asked again
    assert "get_weather" in offered(model.requests[0]) and "session_search" in offered(model.requests[0])
    assert model.requests[0].body["tool_choice"] == "auto"
    sent = model.requests[1].messages
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"]
    assert sent[-1]["content"] == "sunny, 24 C" and sent[-2]["tool_calls"][0]["id"] == "call_w1"
    assert rows == [("user", "weather in Lyon?", None), ("assistant", None, ["call_w1"]),
                    ("tool", "sunny, 24 C", "call_w1"), ("assistant", answer.message.content, None)]


async def test_streamed_tool_calls_and_their_streamed_continuation(tmp_path, model):
    model.script(ToolCalls([ToolCall("get_weather", {"city": "Lyon"}, "call_a"),
                            ToolCall("get_weather", {"city": "Oslo"}, "call_b")], content="Let me check."))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        history: list[dict] = [{"role": "user", "content": "Lyon or Oslo?"}]
        calls: dict[int, dict] = {}
        text, finish = "", None
        async with await client.chat.completions.create(model="m", messages=history, tools=[WEATHER],
                                                        stream=True) as stream:
            async for chunk in stream:
                choice = chunk.choices[0]
                text += choice.delta.content or ""
                for delta in choice.delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] += delta.id or ""
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
                finish = choice.finish_reason or finish
        history.append({"role": "assistant", "content": text, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})
        history += [{"role": "tool", "tool_call_id": "call_a", "content": "rain"},
                    {"role": "tool", "tool_call_id": "call_b", "content": "snow"}]
        pieces = []
        async with await client.chat.completions.create(model="m", messages=history, tools=[WEATHER],
                                                        stream=True) as stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        await client.close()
    assert finish == "tool_calls" and text == "Let me check."
    assert [(c["id"], json.loads(c["arguments"])) for c in calls.values()] == \
        [("call_a", {"city": "Lyon"}), ("call_b", {"city": "Oslo"})]
    assert "".join(pieces) == "echo: Lyon or Oslo? | turns: 1 | first: Lyon or Oslo?"
    assert [m["role"] for m in model.requests[1].messages[-4:]] == ["user", "assistant", "tool", "tool"]


async def test_with_a_session_key_the_results_alone_continue_and_the_agents_own_tools_run_inside(tmp_path, model):
    # the model calls the agent's session_search and the client's tool at once: the gateway runs its own
    model.script(ToolCalls([ToolCall("session_search", {"query": "Lyon"}, "call_s"),
                            ToolCall("get_weather", {"city": "Lyon"}, "call_w")]))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.OpenAI(base_url=base_url(gw), api_key="sk-anything", default_headers={"X-Session-Key": "k"})
        first = await asyncio.to_thread(client.chat.completions.create, model="m", tools=[WEATHER],
                                        messages=[{"role": "user", "content": "weather?"}])
        second = await asyncio.to_thread(client.chat.completions.create, model="m", tools=[WEATHER],
                                         messages=[{"role": "tool", "tool_call_id": "call_w", "content": "fog"}])
        with pytest.raises(openai.ConflictError) as again:  # the same results once more: not answered twice
            await asyncio.to_thread(client.chat.completions.create, model="m", tools=[WEATHER],
                                    messages=[{"role": "tool", "tool_call_id": "call_w", "content": "fog"}])
        with pytest.raises(openai.BadRequestError) as unknown:
            await asyncio.to_thread(client.chat.completions.create, model="m", tools=[WEATHER],
                                    messages=[{"role": "tool", "tool_call_id": "call_zz", "content": "?"}])
        client.close()
        (session,) = await gw.db.sessions.list_rich(source="api", limit=10)
        roles = [(role, ref) for role, _, ref in await stored(gw, session["id"])]
    assert [c.id for c in first.choices[0].message.tool_calls] == ["call_w"]  # only the client's call
    assert first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].message.content == "echo: weather? | turns: 1 | first: weather?"
    assert roles == [("user", None), ("assistant", ["call_s", "call_w"]), ("tool", "call_s"), ("tool", "call_w"),
                     ("assistant", None)]
    assert "already" in again.value.message
    assert "call_zz" in unknown.value.message
    assert len(model.requests) == 2


async def test_a_client_tool_named_like_an_agent_tool_is_a_400_naming_it(tmp_path, model):
    clash = {"type": "function", "function": {"name": "session_search", "parameters": {"type": "object"}}}
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", tools=[WEATHER, clash],
                                                 messages=[{"role": "user", "content": "hi"}])
        await client.close()
        sessions = await gw.db.sessions.list_rich(source="api", limit=10)
    assert refused.value.status_code == 400
    assert "'session_search'" in refused.value.message
    assert refused.value.body["param"] == "tools[1].function.name"
    assert refused.value.body["code"] == "tool_name_conflict"
    assert sessions == [] and model.requests == []  # nothing stored, nothing asked


async def test_langchain_bind_tools_invoke_returns_the_tool_call(tmp_path, model):
    @lc_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    model.script(ToolCall("get_weather", {"city": "Paris"}, call_id="call_lc"))
    async with running_gateway(tmp_path, model) as gw:
        llm = ChatOpenAI(base_url=base_url(gw), api_key="sk-anything", model="m", max_retries=0)
        bound = llm.bind_tools([get_weather])
        message = await asyncio.to_thread(bound.invoke, "weather in Paris?")  # the sync client, off the loop
        result = await asyncio.to_thread(get_weather.invoke, message.tool_calls[0])
        final = await bound.ainvoke(["weather in Paris?", message, result])
    assert message.tool_calls == [{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_lc",
                                   "type": "tool_call"}]
    assert final.content == "echo: weather in Paris? | turns: 1 | first: weather in Paris?"
    assert [m["role"] for m in model.requests[1].messages[1:]] == ["user", "assistant", "tool"]


async def test_a_new_message_instead_of_the_results_leaves_no_call_unanswered_in_the_prompt(tmp_path, model):
    model.script(ToolCall("get_weather", {"city": "Lyon"}, call_id="call_x"))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        history: list[dict] = [{"role": "user", "content": "weather?"}]
        called = await client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
        history += [called.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "never mind, tell me a joke"}]
        answer = await client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
        await client.close()
    assert answer.choices[0].message.content == "echo: never mind, tell me a joke | turns: 2 | first: weather?"
    sent = model.requests[1].messages
    assert [(m["role"], m.get("tool_call_id")) for m in sent[-4:]] == \
        [("user", None), ("assistant", None), ("tool", "call_x"), ("user", None)]
    assert sent[-2]["content"].startswith("error: no result came back")


@pytest.mark.parametrize("body, param", [
    ({"tools": {"name": "x"}}, "tools"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id"),
    ({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, "messages"),
])
async def test_bad_tools_and_tool_messages_are_400s_naming_the_field(tmp_path, model, body, param):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(**{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                    **body})
        await client.close()
        sessions = await gw.db.sessions.list_rich(source="api", limit=10)
    assert refused.value.body["param"] == param
    assert sessions == [] and model.requests == []


async def test_the_text_before_a_client_tool_call_never_shows_or_stores_the_memory_fence(tmp_path, model):
    echoed = f"{MEMORY_OPEN}\n- #3 Ann's favourite city is Lyon\n{MEMORY_CLOSE}\nLet me check."
    model.stream_chunk_chars = 3  # the block arrives split across chunks
    model.script(ToolCalls([ToolCall("get_weather", {"city": "Lyon"}, "call_s")], content=echoed),
                 ToolCalls([ToolCall("get_weather", {"city": "Lyon"}, "call_p")], content=echoed))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        pieces, finish = [], None
        async with await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], stream=True,
                extra_headers={"X-Session-Key": "fenced"}) as stream:
            async for chunk in stream:
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "weather, plainly?"}], tools=[WEATHER])
        await client.close()
        streamed_rows = await stored(gw, await gw.db.routes.get("agent:main:api:dm:fenced"))
        plain_rows = await stored(gw, raw.headers["X-Switchboard-Session"])
    plain = raw.parse().choices[0]
    assert finish == "tool_calls"
    assert all("<" not in p for p in pieces), pieces
    assert "".join(pieces).strip() == "Let me check."
    assert plain.finish_reason == "tool_calls" and plain.message.content.strip() == "Let me check."
    assert [(role, (text or "").strip(), calls) for role, text, calls in streamed_rows[-1:] + plain_rows[-1:]] == \
        [("assistant", "Let me check.", ["call_s"]), ("assistant", "Let me check.", ["call_p"])]
