"""Compression through the real gateway: the 75 % trigger, the #N chain, /compress, failures, isolation."""

import asyncio

import pytest

import compression
from tests.fakes.model_server import Fail, FakeModel, Hang, Reply
from tests.harness import ApiClient, eventually, running_gateway

KEY = "agent:main:api:dm:k"
WINDOW = 4096  # threshold 0.75 -> 3072 tokens
LONG = "details about the migration plan, the staging database and the rollback steps. " * 4


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def settings(**extra):
    return {"model": {"context_length": WINDOW}, "compression": {"timeout_seconds": 2, "cooldown_seconds": 600, **extra}}


async def chat(api, n, prefix="turn"):
    return [await api.say("k", f"{prefix} {i}: {LONG}") for i in range(n)]


def summary_requests(model):
    return [r for r in model.requests if "summar" in (r.messages[0].get("content") or "").lower()]


async def test_no_compression_below_the_threshold(tmp_path, model):
    model.script(*[Reply("ok", prompt_tokens=2000)] * 8)
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 8)
        await api.close()
        sid = await gw.db.routes.get(KEY)
        assert (await gw.db.sessions.get(sid)).parent_session_id is None
    assert summary_requests(model) == []


async def test_the_threshold_splits_into_a_titled_child_and_the_chain_continues(tmp_path, model):
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 6)
        assert await api.say("k", "/title migration") == "Session title set: migration"
        root = await gw.db.routes.get(KEY)
        # the trigger, then the memory turn before the split, the summary, the answer
        model.script(Reply("ok", prompt_tokens=3500), Reply("nothing new to remember"),
                     Reply("FIRST SUMMARY: staging database chosen"), Reply("after one"))
        await api.say("k", "one more")  # reports 3,500 tokens: over 75 % of 4,096
        raw = await api.client.chat.completions.with_raw_response.create(  # the trigger fires before this call
            model="m", messages=[{"role": "user", "content": "and now?"}], extra_headers={"X-Session-Key": "k"})
        answer = raw.parse().choices[0].message.content
        second = await gw.db.routes.get(KEY)
        assert second != root
        notice = raw.headers["X-Switchboard-Notice"]  # beside the answer, never in it
        assert notice.startswith('Compressed: ') and 'Continuing as "migration #2".' in notice
        assert answer == "after one"

        await chat(api, 6, prefix="more")
        model.script(Reply("ok", prompt_tokens=3600), Reply("nothing new"), Reply("SECOND SUMMARY"), Reply("after two"))
        await api.say("k", "again")
        await api.say("k", "and again?")
        third = await gw.db.routes.get(KEY)
        await api.close()

        parent, child, grandchild = [await gw.db.sessions.get(s) for s in (root, second, third)]
        assert (child.parent_session_id, grandchild.parent_session_id) == (root, second)
        assert (parent.end_reason, child.end_reason) == ("compression", "compression")
        assert (child.title, grandchild.title) == ("migration #2", "migration #3")
        assert await gw.db.sessions.compression_tip(root) == third
        assert await gw.db.sessions.resolve_id("migration") == third
        # the parent keeps its whole history
        assert len(await gw.db.messages.get(root)) == 2 * 7 + 1
        child_messages = await gw.db.messages.get(third)
        assert any(compression.is_summary(m.as_dict()) for m in child_messages)
    # the second summary request carried the first summary forward
    requests = summary_requests(model)
    assert len(requests) == 2
    assert "FIRST SUMMARY" in str(requests[1].messages)
    # before each split the agent had a turn to keep what matters in memory
    flushes = [r for r in model.requests if "about to be compressed" in str(r.messages)]
    assert len(flushes) == 2


async def test_compress_command_with_a_focus(tmp_path, model):
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 7)
        model.script(Reply("nothing new to remember"), Reply("focused summary"))
        answer = await api.say("k", "/compress keep the rollback steps")
        await api.close()
        assert answer.startswith("Compressed: 14 → ") and answer.endswith("Continuing in a new session.")
    assert "keep the rollback steps" in str(summary_requests(model)[0].messages)


async def test_compress_with_too_little_changes_nothing(tmp_path, model):
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 2)
        before = await gw.db.routes.get(KEY)
        answer = await api.say("k", "/compress")
        await api.close()
        assert answer == "Nothing to compress yet: the conversation is still short. Nothing was changed."
        assert await gw.db.routes.get(KEY) == before


@pytest.mark.parametrize("failure", ["error", "timeout"])
async def test_a_failing_summarizer_changes_nothing_and_the_turn_is_answered(tmp_path, model, failure):
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 6)
        sid = await gw.db.routes.get(KEY)
        stored_before = len(await gw.db.messages.get(sid))
        broken = [Fail(500)] * 4 if failure == "error" else [Hang(30)]
        model.script(Reply("ok", prompt_tokens=3300), Reply("nothing new to remember"), *broken,
                     Reply("still answered"))
        await api.say("k", "push it over")
        answer = await api.say("k", "are you there?")
        assert answer == "still answered"
        assert await gw.db.routes.get(KEY) == sid
        assert len(await gw.db.messages.get(sid)) == stored_before + 4
        # the cooldown: the next turn does not try again
        requests_before = len(model.requests)
        await api.say("k", "one more")
        assert len(model.requests) == requests_before + 1
        await api.close()


async def test_other_sessions_are_answered_while_one_compresses(tmp_path, model):
    async with running_gateway(tmp_path, model, **settings(timeout_seconds=20)) as gw:
        api = ApiClient(gw)
        await chat(api, 6)
        model.script(Reply("ok", prompt_tokens=3500))
        await api.say("k", "over the line")
        model.script(Reply("nothing new to remember"), Hang(3))  # the memory turn, then a slow summarizer
        slow = asyncio.create_task(api.say("k", "compress me"))
        await model.wait_for_requests(len(model.requests) + 2)
        other = await asyncio.wait_for(api.say("other", "hello"), 2)
        assert other == "echo: hello | turns: 1 | first: hello"
        assert not slow.done()
        await slow
        await api.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_api_names_the_session_the_answer_was_stored_in(tmp_path, model, stream):
    """A turn that compressed answers in the new child: the response's session_id says so (issue #26)."""
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 6)
        root = await gw.db.routes.get(KEY)
        model.script(Reply("ok", prompt_tokens=3500), Reply("nothing new to remember"), Reply("SUMMARY"),
                     Reply("after the split"))
        await api.say("k", "one more")  # reports 3,500 tokens: the next turn compresses first
        request = {"model": "switchboard", "messages": [{"role": "user", "content": "and now?"}],
                   "extra_headers": {"X-Session-Key": "k"}}
        if stream:
            chunks = [chunk async for chunk in await api.client.chat.completions.create(stream=True, **request)]
            named = chunks[-1].model_extra["session_id"]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            response = await api.client.chat.completions.create(**request)
            named = response.model_extra["session_id"]
            text = response.choices[0].message.content
        await api.close()
        child = await gw.db.routes.get(KEY)
        assert child != root and "after the split" in text
        assert (await gw.db.messages.get(child))[-1].content == "after the split"
        assert named == child


async def test_a_small_window_is_not_compressed_over_and_over(tmp_path, model):
    """With a 1,500-token window a split saves little and the next turn is over the threshold again: it
    used to start a new child every other turn (issue #26).  A split must leave room for a turn as large
    as the last one, so each child answers several turns before the next split."""
    def summarizer(messages):
        if "write the memory" in (messages[0].get("content") or ""):
            return "Goals: migrate. Facts: the staging database. " * 6
        return None

    model.responder = summarizer
    text = "details about the migration plan, the staging database and the rollback steps. " * 2
    async with running_gateway(tmp_path, model, model={"context_length": 1500},
                               compression={"timeout_seconds": 2}) as gw:
        api = ApiClient(gw)
        answers, notices, sessions = [], [], []
        for i in range(16):
            raw = await api.client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"turn {i}: {text}"}],
                extra_headers={"X-Session-Key": "k"})
            answers.append(raw.parse().choices[0].message.content)
            notices.append(raw.headers.get("X-Switchboard-Notice", ""))  # beside the answer, never in it
            sessions.append(await gw.db.routes.get(KEY))
        await api.close()
    assert all(f"echo: turn {i}:" in answer for i, answer in enumerate(answers))  # every turn answered
    splits = [i for i in range(1, 16) if sessions[i] != sessions[i - 1]]
    assert splits and all(b - a >= 3 for a, b in zip(splits, splits[1:], strict=False)), splits  # no split a turn
    assert [i for i, n in enumerate(notices) if n.startswith("Compressed:")] == splits
    assert not any("left out of this reply" in n for n in notices)


async def test_a_message_that_arrives_while_the_summary_is_written_is_answered_in_the_child(tmp_path, model):
    async with running_gateway(tmp_path, model, **settings()) as gw:
        api = ApiClient(gw)
        await chat(api, 6)
        root = await gw.db.routes.get(KEY)
        model.script(Reply("ok", prompt_tokens=3500))
        await api.say("k", "one more")  # the next turn compresses first
        model.script(Reply("nothing new to remember"), Reply("SUMMARY: the migration plan"))
        model.delay = 0.4  # the memory turn, the summary and the answer each take a while
        compressing = asyncio.create_task(api.say("k", "and now?"))
        await eventually(lambda: any("write the memory" in str(r.messages[0].get("content")) for r in model.requests),
                         10, "the summary request")
        meanwhile = await api.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": "arrived meanwhile"}],
            extra_headers={"X-Session-Key": "k"})
        answered_first = await compressing
        await api.close()
        child = await gw.db.routes.get(KEY)
        parent = await gw.db.sessions.get(root)
        in_child = [(m.role, m.content) for m in await gw.db.messages.get(child)]
        in_parent = await gw.db.messages.get(root)
    assert child != root and parent.end_reason == "compression"
    assert meanwhile.choices[0].message.content.startswith("echo: arrived meanwhile")
    assert "echo: and now? |" in answered_first  # each message answered by one turn: its own
    assert meanwhile.model_extra["session_id"] == child
    # the message was carried into the child (stored, as in any turn, before the answer being written
    # then) and answered there
    assert ("user", "arrived meanwhile") in in_child
    assert in_child[-1] == ("assistant", meanwhile.choices[0].message.content)
    assert [m for m in in_parent if m.role == "assistant" and m.timestamp > parent.ended_at] == []


async def test_a_chat_on_a_named_model_is_compressed_for_that_models_window(tmp_path, model):
    """``models.<name>.context_length``: a chat that chose a small model is compressed at 75 % of its window,
    where the same history on the default's large window is not."""
    async with FakeModel() as small:
        named = {"small": {"base_url": small.base_url, "api_key": "k", "name": "small-4k", "context_length": WINDOW}}
        async with running_gateway(tmp_path, model, model={"context_length": 100_000},
                                   compression={"timeout_seconds": 2, "cooldown_seconds": 600}, models=named) as gw:
            api = ApiClient(gw)
            await chat(api, 4)
            model.script(Reply("ok", prompt_tokens=3500))
            await api.say("k", "on the default")  # 3,500 of 100,000 tokens: far from the threshold
            await api.say("k", "still the default")
            root = await gw.db.routes.get(KEY)
            assert summary_requests(model) == []
            assert await api.say("k", "/model small") == "This chat now uses the model small."
            small.script(Reply("ok", prompt_tokens=3500))  # over 75 % of the small model's 4,096
            await api.say("k", "on the small model")
            model.script(Reply("nothing new to remember"), Reply("SUMMARY: the migration plan"))
            await api.say("k", "and now?")
            await api.close()
            child = await gw.db.routes.get(KEY)
    assert child != root
    assert len(summary_requests(model)) == 1
    assert any("SUMMARY: the migration plan" in (m.get("content") or "") for m in small.requests[-1].messages)
