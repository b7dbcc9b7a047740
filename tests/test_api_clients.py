"""Stock OpenAI clients against the running gateway with nothing but a base URL and a key: the real
``openai`` SDK (sync, async, streamed) and ``langchain-openai``, sending their whole history and no
session header, as Open WebUI, LibreChat, LangChain and ``llm`` do."""

import asyncio
import base64
import io
import socket

import aiohttp
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from PIL import Image
from pydantic import BaseModel

from tests.fakes.model_server import Fail, FakeModel, Reply, ToolCall
from tests.harness import eventually, running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def base_url(gw) -> str:
    return f"http://127.0.0.1:{gw.api.bound_port}/v1"


def echo(last: str, turns: int, first: str) -> str:
    return f"echo: {last} | turns: {turns} | first: {first}"


async def api_sessions(gw) -> list[dict]:
    return await gw.db.sessions.list_rich(source="api", include_children=True, limit=100)


async def conversation_of(gw, session_id: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in await gw.db.messages.get(session_id)]


async def test_the_sync_sdk_with_its_whole_history_continues_one_session_storing_nothing_twice(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.OpenAI(base_url=base_url(gw), api_key="sk-anything")
        history: list[dict] = []
        sessions = set()
        for text in ["my name is Alice", "I live in Lyon", "what is my name?"]:
            history.append({"role": "user", "content": text})
            raw = await asyncio.to_thread(client.chat.completions.with_raw_response.create,
                                          model="gpt-4o-mini", messages=history)
            sessions.add(raw.headers["X-Switchboard-Session"])
            history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        client.close()
        (session_id,) = sessions
        stored = await conversation_of(gw, session_id)
    assert history[-1]["content"] == echo("what is my name?", 3, "my name is Alice")  # the model saw the history
    assert stored == [(m["role"], m["content"]) for m in history]  # each message once, in order
    assert len(model.requests) == 3


async def test_async_and_streamed_requests_and_the_client_system_message_after_the_gateways(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        system = {"role": "system", "content": "You are a pirate. Today is Tuesday."}
        first = await client.chat.completions.create(model="m", messages=[system, {"role": "user", "content": "ahoy"}])
        history = [system, {"role": "user", "content": "ahoy"},
                   {"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "where is the treasure?"}]
        history[0] = {"role": "system", "content": "You are a pirate. Today is Wednesday."}  # templated: changes
        pieces = []
        async with await client.chat.completions.create(model="m", messages=history, stream=True) as stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        await client.close()
        sessions = await api_sessions(gw)
    assert "".join(pieces) == echo("where is the treasure?", 2, "ahoy")
    assert len(sessions) == 1  # the system message is not part of the fingerprint
    prompt = model.requests[-1].messages
    assert prompt[0]["role"] == "system" and "current date" in prompt[0]["content"]  # the gateway's persona first
    assert prompt[1] == {"role": "system", "content": "You are a pirate. Today is Wednesday."}
    assert [m["role"] for m in prompt[2:]] == ["user", "assistant", "user"]


async def test_an_edited_message_continues_in_a_child_session_that_branches_there(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")

        async def say(messages: list[dict]) -> tuple[str, str]:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
            return raw.parse().choices[0].message.content, raw.headers["X-Switchboard-Session"]

        u1, u2 = {"role": "user", "content": "plan a trip"}, {"role": "user", "content": "to Rome"}
        a1, first = await say([u1])
        a2, same = await say([u1, {"role": "assistant", "content": a1}, u2])
        edited = {"role": "user", "content": "to Oslo"}
        a2_edited, child = await say([u1, {"role": "assistant", "content": a1}, edited])
        # a regenerated answer: the same history again, without the answer it got
        _, regenerated = await say([u1, {"role": "assistant", "content": a1}, edited])
        await client.close()
        original, branch = await conversation_of(gw, first), await conversation_of(gw, child)
        child_row, regen_row = await gw.db.sessions.get(child), await gw.db.sessions.get(regenerated)
    assert same == first
    assert a2_edited == echo("to Oslo", 2, "plan a trip")
    assert child != first and child_row.parent_session_id == first
    assert original == [("user", "plan a trip"), ("assistant", a1), ("user", "to Rome"), ("assistant", a2)]
    assert branch == [("user", "plan a trip"), ("assistant", a1), ("user", "to Oslo"), ("assistant", a2_edited)]
    assert regen_row.parent_session_id == child and regenerated not in (first, child)


async def test_request_fields_reach_the_model_and_n_above_one_is_refused(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        model.script(Reply('{"city": "Lyon"}'))
        answer = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "where?"}], temperature=0.2, top_p=0.9,
            max_completion_tokens=50, stop=["\n\n"], seed=7, response_format={"type": "json_object"},
            tool_choice="none")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two"}], n=2)
        await client.close()
    body = model.requests[0].body
    assert answer.choices[0].message.content == '{"city": "Lyon"}'
    assert {k: body.get(k) for k in ("temperature", "top_p", "max_completion_tokens", "stop", "seed",
                                     "response_format", "tool_choice")} == {
        "temperature": 0.2, "top_p": 0.9, "max_completion_tokens": 50, "stop": ["\n\n"], "seed": 7,
        "response_format": {"type": "json_object"}, "tool_choice": "none"}
    assert refused.value.body["param"] == "n" and len(model.requests) == 1


async def test_an_image_reaches_a_vision_model(tmp_path, model):
    # A whole picture: a broken one is refused on arrival (gateway/media_read.py) and never sent.
    buf = io.BytesIO()
    Image.new("RGB", (2, 2), "red").save(buf, format="PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    async with running_gateway(tmp_path, model, model={"vision": True}) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}]}])
        await client.close()
    last = model.requests[0].messages[-1]
    assert last["content"][0]["type"] == "text" and last["content"][0]["text"].startswith("what is this?")
    assert last["content"][1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}


async def test_langchain_with_no_configuration_history_batch_and_structured_output(tmp_path, model):
    class City(BaseModel):
        city: str

    async with running_gateway(tmp_path, model) as gw:
        llm = ChatOpenAI(base_url=base_url(gw), api_key="sk-anything", model="gpt-4o-mini", max_retries=0)
        first = await llm.ainvoke([HumanMessage("my name is Alice")])
        named = await llm.ainvoke([SystemMessage("be brief"), HumanMessage("my name is Alice"),
                                   AIMessage(first.content), HumanMessage("what is my name?")])
        batch = await llm.abatch(["b1", "b2", "b3"])
        model.script(Reply('{"city": "Lyon"}'))
        structured = await llm.with_structured_output(City, method="json_schema").ainvoke("where do I live?")
    assert named.content == echo("what is my name?", 2, "my name is Alice")
    assert [m.content for m in batch] == [echo(b, 1, b) for b in ("b1", "b2", "b3")]
    assert structured == City(city="Lyon")
    assert model.requests[-1].body["response_format"]["type"] == "json_schema"


async def test_three_concurrent_requests_in_one_session_each_get_their_own_answer_in_order(tmp_path):
    async with FakeModel(delay=0.3) as model:
        async with running_gateway(tmp_path, model) as gw:
            llm = ChatOpenAI(base_url=base_url(gw), api_key="sk-anything", model="m", max_retries=0,
                             default_headers={"X-Session-Key": "burst"})
            first = asyncio.create_task(llm.ainvoke("d1"))
            await model.wait_for_requests(1)
            rest = [asyncio.create_task(llm.ainvoke(text)) for text in ("d2", "d3")]
            replies = [m.content for m in await asyncio.gather(first, *rest)]
            stored = await conversation_of(gw, await gw.db.routes.get("agent:main:api:dm:burst"))
    assert replies == [echo(d, n, "d1") for n, d in enumerate(["d1", "d2", "d3"], 1)]
    assert [r.messages[-1]["role"] for r in model.requests] == ["user"] * 3
    assert stored == [pair for reply, d in zip(replies, ["d1", "d2", "d3"], strict=True) for pair in (("user", d), ("assistant", reply))]


async def test_open_webui_chats_by_their_forwarded_ids_and_task_requests_stay_out(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")

        async def owui(user: str, chat: str, messages: list[dict]):
            return await client.chat.completions.with_raw_response.create(
                model="m", messages=messages, extra_headers={"X-OpenWebUI-Chat-Id": chat,
                                                             "X-OpenWebUI-User-Id": user,
                                                             "X-OpenWebUI-User-Name": f"{user} name"})

        hello = [{"role": "user", "content": "hello"}]
        raw = await owui("u1", "chat-1", hello)
        answer = raw.parse().choices[0].message.content
        task = [{"role": "user", "content": "### Task:\nGenerate a concise title for the chat.\n<chat_history>..."}]
        title = await owui("u1", "chat-1", task)
        again = await owui("u1", "chat-1", [*hello, {"role": "assistant", "content": answer},
                                            {"role": "user", "content": "more"}])
        other_chat = await owui("u1", "chat-2", hello)  # the same first message in another chat
        other_user = await owui("u2", "chat-1", hello)  # another user's chat with the same id
        await client.close()
        session = raw.headers["X-Switchboard-Session"]
        stored = await conversation_of(gw, session)
        row = await gw.db.sessions.get(session)
    assert again.headers["X-Switchboard-Session"] == session
    assert title.parse().choices[0].message.content.startswith("echo: ### Task:")
    assert "X-Switchboard-Session" not in title.headers
    assert stored == [("user", "hello"), ("assistant", answer), ("user", "more"),
                      ("assistant", echo("more", 2, "hello"))]  # the task request is not in the chat
    assert (row.user_id, row.user_name) == ("u1", "u1 name")
    assert len({session, other_chat.headers["X-Switchboard-Session"], other_user.headers["X-Switchboard-Session"]}) == 3


async def test_librechat_new_conversation_header_is_ignored_then_its_id_names_the_conversation(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        hello = [{"role": "user", "content": "hi"}]
        fresh = await client.chat.completions.with_raw_response.create(
            model="m", messages=hello, extra_headers={"X-Conversation-Id": "new"})
        named = await client.chat.completions.with_raw_response.create(
            model="m", messages=hello, extra_headers={"X-Conversation-Id": "abc-123"})
        again = await client.chat.completions.with_raw_response.create(
            model="m", messages=[*hello, {"role": "assistant", "content": named.parse().choices[0].message.content},
                                 {"role": "user", "content": "again"}],
            extra_headers={"X-Conversation-Id": "abc-123"})
        await client.close()
    assert fresh.headers["X-Switchboard-Session"] != named.headers["X-Switchboard-Session"]
    assert again.headers["X-Switchboard-Session"] == named.headers["X-Switchboard-Session"]
    assert again.parse().choices[0].message.content == echo("again", 2, "hi")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_model_outage_is_a_502_healthz_degrades_and_a_retry_stores_nothing_twice(tmp_path):
    port = _free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}/v1"
    offline = type("Offline", (), {"base_url": url})()
    async with running_gateway(tmp_path, offline, model={"max_retries": 1}) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything", max_retries=0)
        question = [{"role": "user", "content": "are you there?"}]
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="m", messages=question, extra_headers={"Idempotency-Key": "q1"})
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/healthz") as r:
                down = await r.json()
            async with FakeModel(port=port) as model:
                async def health() -> dict:
                    async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/healthz") as r:
                        return await r.json()

                back: dict = {}

                async def recovered() -> bool:  # the next probe (a few seconds on) finds the model back
                    back.update(await health())
                    return back["status"] == "ok"

                await eventually(recovered, timeout=10, what="healthz ok again", every=0.2)
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=question, extra_headers={"Idempotency-Key": "q1"})
        await client.close()
        stored = await conversation_of(gw, raw.headers["X-Switchboard-Session"])
    assert failed.value.status_code == 502
    assert {k: v for k, v in failed.value.body.items() if k != "message"} == {
        "type": "server_error", "param": None, "code": "model_unreachable"}
    assert failed.value.body["message"].startswith("The model is unavailable right now (connection refused)")
    assert (down["status"], down["model"]["state"]) == ("degraded", "unreachable")
    assert (back["status"], back["model"]["state"]) == ("ok", "ok")
    assert raw.parse().choices[0].message.content == echo("are you there?", 1, "are you there?")
    assert stored == [("user", "are you there?"), ("assistant", echo("are you there?", 1, "are you there?"))]
    assert len(model.requests) == 1


async def test_every_error_is_openai_shaped_json_and_a_model_can_be_retrieved(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        retrieved = await client.models.retrieve("fake-model")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-5")
        await client.close()
        base = f"http://127.0.0.1:{gw.api.bound_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/v1/nowhere") as r:
                missing = (r.status, await r.json())
            async with http.get(base + "/v1/chat/completions") as r:
                wrong = (r.status, await r.json())
            async with http.post(base + "/v1/chat/completions", data=b"x" * (17 * 1024 * 1024)) as r:
                large = (r.status, await r.json())
    assert retrieved.id == "fake-model"
    assert missing[0] == 404 and missing[1]["error"]["code"] == "not_found"
    assert wrong[0] == 405 and wrong[1]["error"]["code"] == "method_not_allowed"
    assert large[0] == 413 and large[1]["error"]["code"] == "request_too_large"
    assert all(set(body["error"]) == {"message", "type", "param", "code"} for _, body in (missing, wrong, large))


async def test_the_sdks_own_retry_after_a_model_failure_stores_the_message_once(tmp_path, model):
    model.script(Fail(503))  # the gateway does not retry (max_retries 0): a 503, which the SDK retries by itself
    async with running_gateway(tmp_path, model, model={"max_retries": 0}) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")  # the SDK's default retries
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}],
                                                      extra_headers={"X-Session-Key": "k"})
        await client.close()
        stored = await conversation_of(gw, await gw.db.routes.get("agent:main:api:dm:k"))
    assert answer.choices[0].message.content == echo("hello", 1, "hello")
    assert stored == [("user", "hello"), ("assistant", echo("hello", 1, "hello"))]
    assert len(model.requests) == 2


async def test_a_client_kept_conversation_goes_on_after_compression_without_branching(tmp_path, model):
    long = "details about the migration plan, the staging database and the rollback steps. " * 4
    settings = {"model": {"context_length": 4096}, "compression": {"timeout_seconds": 2, "cooldown_seconds": 600}}
    async with running_gateway(tmp_path, model, **settings) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")
        history: list[dict] = []

        async def say(text: str) -> str:
            history.append({"role": "user", "content": text})
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=history)
            history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
            return raw.headers["X-Switchboard-Session"]

        for i in range(6):
            root = await say(f"turn {i}: {long}")
        # reports 3,500 tokens (over 75 % of 4,096); the next turn compresses first: the memory turn,
        # the summary, then its answer
        model.script(Reply("ok", prompt_tokens=3500), Reply("nothing new to remember"),
                     Reply("SUMMARY: staging database chosen"), Reply("after the split"))
        assert await say("one more") == root
        child = await say("and now?")
        after = await say("still there?")
        await client.close()
        child_row = await gw.db.sessions.get(child)
        stored = await conversation_of(gw, child)
    assert child != root and child_row.parent_session_id == root  # compression's child, no branch
    assert after == child
    assert stored[-4:] == [(m["role"], m["content"]) for m in history[-4:]]  # each new message once
    assert sum(1 for role, text in stored if text == "and now?") == 1


async def test_an_empty_answer_is_a_failure_and_the_message_is_answered_by_the_next_request(tmp_path, model):
    # nothing empty is ever stored as an answer (issue #36): the client is told, and asking again answers it
    model.script(Reply(""))
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything", max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hm"}])
        again = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hm"}])
        await client.close()
        sid = again.headers["X-Switchboard-Session"]
        stored = await conversation_of(gw, sid)
    assert failed.value.status_code == 503 and "empty answer" in str(failed.value)
    assert again.parse().choices[0].message.content == "echo: hm | turns: 1 | first: hm"
    assert [text for role, text in stored if role == "assistant"] == ["echo: hm | turns: 1 | first: hm"]


async def test_a_regenerated_answer_branches_without_the_old_answers_tool_calls(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = openai.AsyncOpenAI(base_url=base_url(gw), api_key="sk-anything")

        async def say(messages: list[dict]) -> tuple[str, str]:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
            return raw.parse().choices[0].message.content, raw.headers["X-Switchboard-Session"]

        u1, u2 = {"role": "user", "content": "hi"}, {"role": "user", "content": "what did we say last week?"}
        a1, first = await say([u1])
        model.script(ToolCall("session_search", {"query": "last week"}), Reply("we spoke of Lyon"))
        a2, _ = await say([u1, {"role": "assistant", "content": a1}, u2])
        model.script(Reply("we spoke of Oslo"))
        regenerated, child = await say([u1, {"role": "assistant", "content": a1}, u2])
        await client.close()
        original = [m.role for m in await gw.db.messages.get(first)]
        branch = await conversation_of(gw, child)
    assert (a2, regenerated) == ("we spoke of Lyon", "we spoke of Oslo")
    assert original == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert branch == [("user", "hi"), ("assistant", a1), ("user", "what did we say last week?"),
                      ("assistant", "we spoke of Oslo")]
