"""The before-the-model-call decision against a fake OpenAI-compatible model that reports usage.

The real ``openai`` client talks to ``tests.fakes.model_server`` on 127.0.0.1
(port 0): the usage it reports drives the trigger, and the same server writes
the summaries (or fails, or hangs).
"""

from __future__ import annotations

import openai
import pytest

from compression import (
    CompressionFailed,
    NothingToCompress,
    TooLittleToGain,
    estimate_tokens,
    is_summary,
    prepare_history,
)
from compression.prompt import SYSTEM_PROMPT
from state import AsyncSessionDB
from tests.fakes.model_server import Fail, FakeModel, Hang, Reply

KEY = "discord:dm:7"
WINDOW = 10_000  # threshold 0.75: 7,500 tokens


@pytest.fixture
async def adb(tmp_path):
    store = await AsyncSessionDB.open(tmp_path / "state.db")
    yield store
    await store.close()


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        fake.client = client
        yield fake
        await client.close()


def summarizer(fake: FakeModel):
    async def summarize(messages: list[dict]) -> str:
        response = await fake.client.chat.completions.create(model="fake-model", messages=messages)
        return response.choices[0].message.content

    return summarize


async def start(adb, turns: int = 20, size: int = 200) -> list[dict]:
    await adb.sessions.create("s", "discord", "fake-model", "u7", session_key=KEY, title="trip")
    await adb.routes.set(KEY, "s")
    history = []
    for i in range(turns):
        history += [{"role": "user", "content": f"question {i} " + "q" * size},
                    {"role": "assistant", "content": f"answer {i} " + "a" * size}]
    await adb.messages.append_many("s", history)
    return await adb.messages.as_conversation("s")


async def turn(adb, fake: FakeModel, history: list[dict], reported: int) -> tuple[int, int, list[dict]]:
    """One answered turn whose usage says ``reported``, then the user's next message."""
    fake.script(Reply("sure", prompt_tokens=reported))
    response = await fake.client.chat.completions.create(model="fake-model", messages=history)
    count = len(history)
    await adb.messages.append_many("s", [{"role": "assistant", "content": response.choices[0].message.content},
                                    {"role": "user", "content": "and then?"}])
    return response.usage.prompt_tokens, count, await adb.messages.as_conversation("s")


async def test_compression_triggers_at_the_threshold_and_not_below(adb, model):
    history = await start(adb)
    added = estimate_tokens([{"role": "assistant", "content": "sure"}, {"role": "user", "content": "and then?"}])

    reported, count, history = await turn(adb, model, history, 7_500 - added - 1)
    below = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                                  reported_prompt_tokens=reported, reported_message_count=count)
    assert below.prompt_tokens == 7_499
    assert (below.session_id, below.history, below.compressed, below.notice) == ("s", history, None, None)
    assert len(model.requests) == 1  # only the turn: no summary was asked for

    reported, count, history = await turn(adb, model, history, 7_500 - added)
    model.script(Reply("Goals: plan the trip.\nFacts: flight LH 454 on 3 May."))
    at = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                               reported_prompt_tokens=reported, reported_message_count=count)
    assert at.prompt_tokens == 7_500
    summary_request = model.requests[-1].messages
    assert summary_request[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert at.session_id != "s" and at.compressed.title == "trip #2"
    assert await adb.routes.get(KEY) == at.session_id
    assert at.history == await adb.messages.as_conversation(at.session_id)
    assert is_summary(at.history[3]) and "LH 454" in at.history[3]["content"]
    assert at.history[-1] == {"role": "user", "content": "and then?"}
    assert at.notice == at.compressed.describe()
    assert at.notice.endswith('Continuing as "trip #2".')


async def test_without_a_report_the_estimate_and_overhead_decide(adb, model):
    history = await start(adb)
    estimate = estimate_tokens(history)
    quiet = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                                  overhead_tokens=7_500 - estimate - 1)
    assert quiet.compressed is None and model.requests == []
    model.script(Reply("summary"))
    loud = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                                 overhead_tokens=7_500 - estimate)
    assert loud.compressed is not None and len(model.requests) == 1


async def test_a_failing_summarizer_leaves_the_session_and_the_turn_goes_on(adb, model):
    history = await start(adb)
    before = await adb.messages.get("s")
    model.script(Fail(500, message="model overloaded"))
    failed = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                                   reported_prompt_tokens=8_000, reported_message_count=len(history))
    assert isinstance(failed.failure, CompressionFailed) and "model overloaded" in str(failed.failure)
    assert (failed.session_id, failed.history, failed.dropped, failed.notice) == ("s", history, 0, None)

    model.script(Hang())
    hung = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW, timeout=0.3,
                                 reported_prompt_tokens=8_000, reported_message_count=len(history))
    assert isinstance(hung.failure, CompressionFailed) and "did not answer within 0.3s" in str(hung.failure)
    assert (hung.session_id, hung.history) == ("s", history)

    assert await adb.messages.get("s") == before
    assert (await adb.sessions.get("s")).ended_at is None
    assert await adb.routes.get(KEY) == "s"
    assert await adb.sessions.list_rich(include_children=True) == await adb.sessions.list_rich()


async def test_in_cooldown_a_prompt_that_does_not_fit_is_trimmed_for_this_call_only(adb, model):
    history = await start(adb, turns=20, size=1_000)  # ~12,000 tokens: over the window
    before = await adb.messages.get("s")
    prepared = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW,
                                     allow_compression=False, overhead_tokens=200, reserve_tokens=500)
    assert model.requests == []
    assert prepared.failure is None and prepared.compressed is None
    assert prepared.dropped > 0 and len(prepared.history) == len(history) - prepared.dropped
    assert prepared.history[:3] == history[:3] and prepared.history[-1] == history[-1]
    assert estimate_tokens(prepared.history) <= WINDOW - 200 - 500
    assert f"the {prepared.dropped} oldest messages" in prepared.notice and "still saved" in prepared.notice
    assert await adb.messages.get("s") == before


async def test_a_short_conversation_over_the_threshold_is_not_compressed(adb, model):
    history = await start(adb, turns=2, size=14_000)  # 4 huge messages: the newest request is in the head
    prepared = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW)
    assert isinstance(prepared.failure, NothingToCompress)
    assert model.requests == []
    assert prepared.session_id == "s"
    assert prepared.history[-1] == history[-1]


async def test_a_few_huge_messages_are_split_with_a_smaller_head_and_tail(adb, model):
    # 8 messages of ~1,400 tokens: the head and a six-message tail would fill the window alone, so
    # they shrink (the tail to the newest request) and the summary takes the rest
    history = await start(adb, turns=4, size=5_000)
    model.script(Reply("SUMMARY: four long questions and answers"))
    prepared = await prepare_history(adb, "s", history, summarizer(model), context_length=WINDOW)
    assert prepared.compressed is not None, prepared.failure
    assert estimate_tokens(prepared.history) < 0.75 * WINDOW
    assert prepared.history[-2:] == history[-2:]  # the newest question and its answer, whole


async def test_a_split_that_would_trigger_again_at_once_is_not_made(adb, model):
    # 20 turns of large messages over a small window with a large system prompt: even the newest
    # question with its answer and the shortest summary leave less room than the last turn took, so a
    # child would be over the threshold again on the next turn.
    history = await start(adb, turns=20, size=2_000)
    before = await adb.messages.get("s")
    window = 6_000  # threshold 4,500, 2,000 of them the history's with this system prompt
    prepared = await prepare_history(adb, "s", history, summarizer(model), context_length=window,
                                     overhead_tokens=2_500, reserve_tokens=100)
    assert isinstance(prepared.failure, TooLittleToGain)
    assert model.requests == []  # decided before any summary was asked for
    assert prepared.session_id == "s" and prepared.compressed is None
    assert await adb.messages.get("s") == before and await adb.routes.get(KEY) == "s"
    assert prepared.notice is not None and "a summary would not free enough of it" in prepared.notice
    assert f"the {prepared.dropped} oldest messages" in prepared.notice
    assert "/new" in prepared.notice and "model.context_length" in prepared.notice

    # the same conversation with a system prompt that leaves the history room is compressed
    model.script(Reply("summary"))
    roomy = await prepare_history(adb, "s", history, summarizer(model), context_length=window, overhead_tokens=0)
    assert roomy.compressed is not None and roomy.failure is None
