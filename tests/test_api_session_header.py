"""``X-Switchboard-Session: <id>`` on a request continues the session a response returned in that
header, for the caller it answered (its bearer token and its user); another caller's id is refused as
not found, exactly as an unknown one.  The stock openai SDK against the running gateway."""

from __future__ import annotations

import openai
import pytest

from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway

HEADER = "X-Switchboard-Session"


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def echo(last: str, turns: int, first: str) -> str:
    return f"echo: {last} | turns: {turns} | first: {first}"


def sdk(gw, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1", api_key=key, max_retries=0,
                              timeout=30)


async def say(client: openai.AsyncOpenAI, messages: list[dict], **headers: str) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, extra_headers=headers)
    return raw.parse().choices[0].message.content, raw.headers[HEADER]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


async def test_the_returned_session_is_continued_with_only_the_new_message_or_the_whole_history(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        alice = sdk(gw, "sk-alice")
        first, session = await say(alice, [user("my name is Alice")])
        second, same = await say(alice, [user("what is my name?")], **{HEADER: session})
        # the whole history with the header: lined up with what is stored, nothing stored twice
        history = [user("my name is Alice"), {"role": "assistant", "content": first}, user("what is my name?"),
                   {"role": "assistant", "content": second}, user("and again?")]
        third, still = await say(alice, history, **{HEADER: session})
        pieces = []
        stream = await alice.chat.completions.create(model="m", messages=[user("streamed")], stream=True,
                                                     extra_headers={HEADER: session})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        await alice.close()
        stored = [(m.role, m.content) for m in await gw.db.messages.get(session)]
        api_sessions = await gw.db.sessions.list_rich(source="api", include_children=True)
    assert same == still == session and len(api_sessions) == 1
    assert second == echo("what is my name?", 2, "my name is Alice")  # the model saw the first turn
    assert third == echo("and again?", 3, "my name is Alice")
    assert "".join(pieces) == echo("streamed", 4, "my name is Alice")
    assert [text for role, text in stored if role == "user"] == [
        "my name is Alice", "what is my name?", "and again?", "streamed"]


async def test_a_gateway_kept_session_is_continued_by_its_id(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        client = sdk(gw, "sk-carol")
        _, session = await say(client, [user("remember the blue door")], **{"X-Session-Key": "carol-desk"})
        answer, same = await say(client, [user("which door?")], **{HEADER: session})
        await client.close()
    assert same == session
    assert answer == echo("which door?", 2, "remember the blue door")


async def test_another_callers_session_is_not_found_and_tells_nothing(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        alice, bob = sdk(gw, "sk-alice"), sdk(gw, "sk-bob")
        _, session = await say(alice, [user("my secret is 4711")])
        refusals = []
        for client, named, extra in ((bob, session, {}), (bob, "20990101_000000_nosuch", {}),
                                     (alice, session, {"user": "mallory"})):
            with pytest.raises(openai.NotFoundError) as refused:
                await client.chat.completions.create(model="m", messages=[user("tell me the secret")],
                                                     extra_headers={HEADER: named}, **extra)
            refusals.append(refused.value.body)
        await alice.close()
        await bob.close()
        stored = [m.content for m in await gw.db.messages.get(session)]
    assert [(r["code"], r["param"]) for r in refusals] == [("session_not_found", HEADER)] * 3
    # the same words for another's session and for none at all, apart from the id named
    assert refusals[0]["message"].replace(session, "ID") == refusals[1]["message"].replace("20990101_000000_nosuch", "ID")
    assert all("4711" not in r["message"] for r in refusals)
    assert stored == ["my secret is 4711", stored[1]]  # nothing of theirs was stored in it
    assert len(model.requests) == 1  # nor answered
