"""``POST /v1/responses`` with the real openai SDK's ``client.responses.create``: plain and streamed,
instructions, previous_response_id continuing a conversation, a function call round trip (kept by the
gateway, and kept by the client as the Codex CLI does), all answered by the same turn as chat
completions."""

import json

import openai
import pytest

from tests.fakes.model_server import Fail, FakeModel, ToolCall
from tests.harness import Clock, running_gateway

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def echo(last: str, turns: int, first: str) -> str:
    return f"echo: {last} | turns: {turns} | first: {first}"


def client_of(gw, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1", api_key="sk-anything",
                              max_retries=0, **kwargs)


async def stored(gw) -> list[list[tuple[str, str | None]]]:
    sessions = await gw.db.sessions.list_rich(source="api", include_children=True, limit=10)
    return [[(m.role, m.content) for m in await gw.db.messages.get(s["id"])] for s in sessions]


async def test_plain_responses_with_instructions_and_previous_response_id_continuing(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        first = await client.responses.create(model="gpt-4.1", input="my name is Ada", instructions="Be brief.")
        second = await client.responses.create(model="gpt-4.1", input="what is my name?",
                                               previous_response_id=first.id)
        await client.close()
        sessions = await stored(gw)
    assert first.id.startswith("resp_") and first.status == "completed"
    assert first.output_text == echo("my name is Ada", 1, "my name is Ada")
    assert second.output_text == echo("what is my name?", 2, "my name is Ada")  # the model saw the history
    assert second.previous_response_id == first.id
    assert second.usage is not None and second.usage.input_tokens > 0
    prompt = model.requests[0].messages
    assert prompt[0]["role"] == "system" and "current date" in prompt[0]["content"]  # the gateway's persona first
    assert prompt[1] == {"role": "system", "content": "Be brief."}
    assert sessions == [[("user", "my name is Ada"), ("assistant", first.output_text),
                         ("user", "what is my name?"), ("assistant", second.output_text)]]


async def test_a_streamed_response_is_the_responses_event_stream(tmp_path, model):
    model.stream_chunk_chars = 5
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        events = [event async for event in await client.responses.create(model="m", input="stream me", stream=True)]
        await client.close()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 1
    assert kinds.count("response.output_text.delta") > 1  # written as the model writes it
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == echo("stream me", 1, "stream me") == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_a_function_call_round_trip_continued_by_previous_response_id(tmp_path, model):
    model.script(ToolCall("get_weather", {"city": "Lyon"}, call_id="call_r1"))
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        called = await client.responses.create(model="m", input="weather in Lyon?", tools=[WEATHER],
                                               tool_choice="auto")
        answered = await client.responses.create(
            model="m", previous_response_id=called.id, tools=[WEATHER],
            input=[{"type": "function_call_output", "call_id": "call_r1", "output": "sunny"}])
        await client.close()
        (rows,) = await stored(gw)
    (call,) = called.output
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == \
        ("function_call", "call_r1", "get_weather", {"city": "Lyon"})
    assert answered.output_text == echo("weather in Lyon?", 1, "weather in Lyon?")
    assert "get_weather" in [t["function"]["name"] for t in model.requests[0].body["tools"]]
    assert model.requests[0].body["tool_choice"] == "auto"
    assert [m["role"] for m in model.requests[1].messages[-3:]] == ["user", "assistant", "tool"]
    assert rows == [("user", "weather in Lyon?"), ("assistant", None), ("tool", "sunny"),
                    ("assistant", answered.output_text)]  # the question once, asked once


async def test_a_streamed_function_call_with_the_client_keeping_the_history_as_codex_does(tmp_path, model):
    model.script(ToolCall("get_weather", {"city": "Oslo"}, call_id="call_c1", content="Checking."))
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw, default_headers={"session_id": "codex-7"})
        question = {"role": "user", "content": [{"type": "input_text", "text": "weather in Oslo?"}]}
        events = [e async for e in await client.responses.create(model="m", input=[question], tools=[WEATHER],
                                                                 stream=True)]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        history = [question, *[item.model_dump(exclude_none=True) for item in done],
                   {"type": "function_call_output", "call_id": "call_c1", "output": "snow"}]
        second = [e async for e in await client.responses.create(model="m", input=history, tools=[WEATHER],
                                                                 stream=True)]
        await client.close()
        sessions = await stored(gw)
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [item.type for item in done] == ["message", "function_call"]
    assert done[0].content[0].text == "Checking." and json.loads(done[1].arguments) == {"city": "Oslo"}
    assert second[-1].type == "response.completed"
    assert second[-1].response.output_text == echo("weather in Oslo?", 1, "weather in Oslo?")
    assert sessions == [[("user", "weather in Oslo?"), ("assistant", "Checking."), ("tool", "snow"),
                         ("assistant", second[-1].response.output_text)]]  # one conversation, nothing twice


async def test_responses_refuse_a_tool_named_like_an_agent_tool_and_an_unknown_previous_response(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        with pytest.raises(openai.BadRequestError) as clash:
            await client.responses.create(model="m", input="hi", tools=[{**WEATHER, "name": "memory"}])
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
        await client.close()
    assert "'memory'" in clash.value.message
    assert unknown.value.body["param"] == "previous_response_id"
    assert model.requests == []


async def test_a_model_failure_is_an_http_error_before_the_stream_and_an_error_event_after(tmp_path, model):
    # plain: every attempt fails; streamed: the agent tool's status line starts the stream, then every call fails
    model.script(*[Fail(503)] * 4, ToolCall("session_search", {"query": "x"}), *[Fail(503)] * 4)
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        with pytest.raises(openai.APIStatusError) as plain:
            await client.responses.create(model="m", input="first")
        seen = []
        with pytest.raises(openai.APIError) as streamed:
            async for event in await client.responses.create(model="m", input="second", stream=True):
                seen.append(event.type)
        await client.close()
    assert plain.value.status_code == 503 and plain.value.code == "model_unavailable"
    assert streamed.value.message.startswith("The model is unavailable right now (HTTP 503)")
    assert seen[:2] == ["response.created", "response.in_progress"] and "response.completed" not in seen


async def test_the_sdks_stream_helper_reads_a_function_call_and_the_final_response(tmp_path, model):
    model.script(ToolCall("get_weather", {"city": "Rome"}, call_id="call_h1"))
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        async with client.responses.stream(model="m", input="weather in Rome?", tools=[WEATHER]) as stream:
            arguments = [e.delta async for e in stream if e.type == "response.function_call_arguments.delta"]
            final = await stream.get_final_response()
        await client.close()
    (call,) = final.output
    assert call.type == "function_call" and call.call_id == "call_h1"
    assert json.loads("".join(arguments)) == {"city": "Rome"}


async def test_conversation_and_session_key_responses_continue_their_sessions(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = client_of(gw)
        one = await client.responses.create(model="m", input="a1", conversation="conv_1")
        two = await client.responses.create(model="m", input="a2", conversation={"id": "conv_1"})
        keyed = await client.responses.create(model="m", input="b1", extra_headers={"X-Session-Key": "k"})
        after = await client.responses.create(model="m", input="b2", previous_response_id=keyed.id)
        await client.close()
        sessions = await stored(gw)
    assert one.conversation.id == "conv_1"
    assert two.output_text == echo("a2", 2, "a1") and after.output_text == echo("b2", 2, "b1")
    assert sorted(sessions) == sorted([
        [("user", "a1"), ("assistant", one.output_text), ("user", "a2"), ("assistant", two.output_text)],
        [("user", "b1"), ("assistant", keyed.output_text), ("user", "b2"), ("assistant", after.output_text)]])


async def test_a_reset_notice_reaches_a_responses_client_in_a_header_never_in_its_output(tmp_path, model):
    clock = Clock()
    async with running_gateway(tmp_path, model, clock=clock,
                               sessions={"reset": {"mode": "idle", "idle_minutes": 60}}) as gw:
        client = client_of(gw)
        await client.responses.create(model="m", input="before the break", extra_headers={"X-Session-Key": "k"})
        old = await gw.db.routes.get("agent:main:api:dm:k")
        clock.advance(61 * 60)
        raw = await client.responses.with_raw_response.create(model="m", input="back again",
                                                              extra_headers={"X-Session-Key": "k"})
        streamed_events = []
        clock.advance(61 * 60)
        async with client.responses.with_streaming_response.create(
                model="m", input="and again", stream=True, extra_headers={"X-Session-Key": "k"}) as response:
            streamed_header = response.headers.get("X-Switchboard-Notice")
            async for line in response.iter_lines():
                streamed_events.append(line)
        await client.close()
    answer = raw.parse()
    assert raw.headers["X-Switchboard-Notice"].startswith("(Started a new session: the previous one was idle")
    assert old in raw.headers["X-Switchboard-Notice"]
    assert answer.output_text == echo("back again", 1, "back again")  # the notice is not in the output
    assert streamed_header is not None and streamed_header.startswith("(Started a new session")
    assert any(line.startswith(": notice: (Started a new session") for line in streamed_events)
    completed = [json.loads(line[len("data: "):]) for line in streamed_events if '"response.completed"' in line]
    assert completed[0]["response"]["output"][0]["content"][0]["text"] == echo("and again", 1, "and again")
