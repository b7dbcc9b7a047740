"""The store-side split, with a real AsyncSessionDB on a temp dir and a recording summarizer."""

from __future__ import annotations

import asyncio

import pytest

from compression import (
    SUMMARY_MARKER,
    CompressionFailed,
    CompressionResult,
    NothingToCompress,
    SessionChanged,
    TooLittleToGain,
    compress_session,
    estimate_tokens,
    is_summary,
    summary_text,
)
from state import AsyncSessionDB

KEY = "telegram:dm:42"


class Summarizer:
    """A fake model for summaries: records each request, answers with the next text."""

    def __init__(self, *texts: str):
        self.texts = list(texts)
        self.requests: list[list[dict]] = []
        self.called = asyncio.Event()
        self.release: asyncio.Event | None = None
        self.error: BaseException | None = None

    async def __call__(self, messages: list[dict]) -> str:
        self.requests.append(messages)
        self.called.set()
        if self.release is not None:
            await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.texts.pop(0) if self.texts else "Goals: keep going."

    def last_body(self) -> str:
        return self.requests[-1][-1]["content"]


@pytest.fixture
async def adb(tmp_path):
    store = await AsyncSessionDB.open(tmp_path / "state.db")
    yield store
    await store.close()


async def new_session(adb, sid: str, *, title: str | None = "my project", key: str | None = KEY, turns: int = 15,
                      tool_at: int | None = None) -> list[dict]:
    await adb.sessions.create(sid, "telegram", "gpt-4o", "u42", system_prompt="You are Switchboard.",
                             session_key=key, user_name="Ada", title=title)
    if key is not None:
        await adb.routes.set(key, sid)
    messages = conversation(turns, tag=sid, tool_at=tool_at)
    await adb.messages.append_many(sid, messages)
    return messages


def conversation(turns: int, *, tag: str = "", tool_at: int | None = None, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + turns):
        out.append({"role": "user", "content": f"{tag} question {i} " + "q" * 200,
                    "platform_message_id": f"{tag}-{i}"})
        if i == tool_at:
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call{i}", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}]})
            out.append({"role": "tool", "tool_call_id": f"call{i}", "tool_name": "search", "content": "r" * 300})
        out.append({"role": "assistant", "content": f"{tag} answer {i} " + "a" * 200})
    return out


async def snapshot(adb) -> dict:
    """Everything a compression could change."""
    sessions = await adb.sessions.list_rich(include_children=True, limit=100)
    return {
        "sessions": [(s["id"], s["ended_at"], s["end_reason"], s["title"], s["message_count"]) for s in sessions],
        "routes": await adb.routes.list(),
        "messages": {s["id"]: await adb.messages.get(s["id"]) for s in sessions},
    }


async def test_a_chain_root_to_2_to_3_keeps_lineage_titles_routes_and_history(adb):
    original = await new_session(adb, "root", turns=15)
    summarizer = Summarizer("Goals: ship v2.\nFacts: staging host stg-7.example.net, port 8443.",
                            "Goals: ship v2.\nFacts: staging host stg-7.example.net, port 8443. Tests pass.")

    first = await compress_session(adb, "root", summarizer, context_length=2_000)

    assert isinstance(first, CompressionResult)
    assert first.old_session_id == "root" and first.title == "my project #2" and first.session_key == KEY
    root, child = await adb.sessions.get("root"), await adb.sessions.get(first.new_session_id)
    assert root.end_reason == "compression" and root.ended_at is not None
    assert child.parent_session_id == "root" and child.ended_at is None
    for field in ("source", "user_id", "user_name", "session_key", "model", "system_prompt"):
        assert getattr(child, field) == getattr(root, field)
    assert await adb.routes.get(KEY) == first.new_session_id
    # The parent keeps its full history, untouched.
    assert [(m.role, m.content) for m in await adb.messages.get("root")] == [
        (m["role"], m["content"]) for m in original
    ]
    # The child: head, the marked summary, the tail.
    stored = await adb.messages.as_conversation(first.new_session_id)
    assert [m["content"] for m in stored[:3]] == [m["content"] for m in original[:3]]
    assert is_summary(stored[3]) and stored[3]["content"].startswith(SUMMARY_MARKER)
    assert "stg-7.example.net" in summary_text(stored[3])
    assert [m["content"] for m in stored[4:]] == [m["content"] for m in original[-len(stored[4:]):]]
    assert len(stored) - 4 >= 6
    assert first.messages_before == 30 and first.messages_after == len(stored)
    assert first.tokens_before == estimate_tokens(original) and first.tokens_after == estimate_tokens(stored)
    assert first.tokens_after < first.tokens_before
    assert first.describe() == (
        f"Compressed: 30 → {len(stored)} messages, ~{round(first.tokens_before, -3):,} → "
        f"~{round(first.tokens_after, -2):,} tokens. Continuing as \"my project #2\"."
    )

    # The conversation goes on in the child, then is compressed again.
    await adb.messages.append_many(first.new_session_id, conversation(10, tag="root", start=15))
    second = await compress_session(adb, first.new_session_id, summarizer, context_length=2_000)

    assert second.title == "my project #3"
    assert (await adb.sessions.get(second.new_session_id)).parent_session_id == first.new_session_id
    assert await adb.routes.get(KEY) == second.new_session_id
    assert await adb.sessions.compression_tip("root") == second.new_session_id
    assert await adb.titles.resolve("my project") == second.new_session_id
    assert [s.id for s in await adb.sessions.lineage(second.new_session_id)] == [
        "root", first.new_session_id, second.new_session_id]
    listed = await adb.sessions.list_rich()
    assert [(s["id"], s.get("lineage_root")) for s in listed] == [(second.new_session_id, "root")]
    # Nothing stored was lost anywhere in the chain.
    assert await adb.messages.count("root") == 30
    assert await adb.messages.count(first.new_session_id) == len(stored) + 20


async def test_the_second_summary_is_built_on_the_first(adb):
    await new_session(adb, "root", turns=15)
    summarizer = Summarizer("Facts: the deploy key is in /etc/app/deploy.pem; budget 4,200 EUR.", "updated")
    first = await compress_session(adb, "root", summarizer, context_length=2_000)
    assert "EARLIER SUMMARY" not in summarizer.last_body()
    await adb.messages.append_many(first.new_session_id, conversation(10, tag="later", start=15))

    await compress_session(adb, first.new_session_id, summarizer, context_length=2_000)

    body = summarizer.last_body()
    assert "EARLIER SUMMARY" in body
    assert "/etc/app/deploy.pem" in body and "4,200 EUR" in body
    assert "later question 15" in body  # and the new middle, not the old one again
    assert "root question 5" not in body


async def test_focus_reaches_the_summarizer(adb):
    await new_session(adb, "root", turns=12)
    summarizer = Summarizer("s")
    await compress_session(adb, "root", summarizer, context_length=2_000, focus="the invoice numbers")
    assert "FOCUS" in summarizer.last_body() and "the invoice numbers" in summarizer.last_body()


async def test_an_untitled_session_stays_untitled(adb):
    await new_session(adb, "plain", title=None, turns=12)
    result = await compress_session(adb, "plain", Summarizer("s"), context_length=2_000)
    assert result.title is None
    assert (await adb.sessions.get(result.new_session_id)).title is None
    assert result.describe().endswith("Continuing in a new session.")


async def test_tool_calls_stay_with_their_results_in_the_child(adb):
    # The last six messages would start with the tool result: the tail is up to six messages, so the
    # call goes to the summary together with its result, never one without the other.
    original = await new_session(adb, "tools", turns=18, tool_at=15)
    assert original[-6]["role"] == "tool" and original[-7].get("tool_calls")
    summarizer = Summarizer("s")
    result = await compress_session(adb, "tools", summarizer, context_length=8_000)
    stored = await adb.messages.as_conversation(result.new_session_id)
    tail = stored[4:]
    assert [m["content"] for m in tail] == [m["content"] for m in original[-5:]]
    assert all(m["role"] != "tool" and not m.get("tool_calls") for m in tail)
    assert "called tool search" in summarizer.last_body() and "TOOL RESULT (search)" in summarizer.last_body()
    # with the group inside the last six, it is kept whole in the tail
    await new_session(adb, "tools2", key="telegram:dm:43", title=None, turns=18, tool_at=16)
    result = await compress_session(adb, "tools2", Summarizer("s"), context_length=8_000)
    tail = (await adb.messages.as_conversation(result.new_session_id))[4:]
    assert tail[0]["content"].startswith("tools2 question 16") and tail[1]["tool_calls"][0]["id"] == "call16"
    assert tail[2] == {"role": "tool", "content": "r" * 300, "tool_call_id": "call16", "tool_name": "search"}


async def test_the_summary_is_redacted_but_copied_messages_are_not(adb):
    await new_session(adb, "s", turns=12)
    await adb.messages.append_many("s", [{"role": "user", "content": "use sk-live-abcdefghijklmnopqrstuvwxyz01"},
                                    {"role": "assistant", "content": "ok"}])
    summarizer = Summarizer("Facts: the API key is sk-abcdefghijklmnopqrstuvwxyz0123 and password: hunter22")
    result = await compress_session(adb, "s", summarizer, context_length=2_000)
    stored = await adb.messages.as_conversation(result.new_session_id)
    text = summary_text(stored[3])
    assert "sk-abcdefghijklmnopqrstuvwxyz0123" not in text and "hunter22" not in text
    assert "[REDACTED]" in text and result.summary == text
    assert stored[-2]["content"] == "use sk-live-abcdefghijklmnopqrstuvwxyz01"  # the user's own message, verbatim


async def test_a_redelivered_platform_event_is_still_recognised_in_the_child(adb):
    await new_session(adb, "s", turns=12)
    result = await compress_session(adb, "s", Summarizer("s"), context_length=2_000)
    again = await adb.messages.append_inbound(result.new_session_id, "s question 11 ...", platform_message_id="s-11")
    assert again.new is False


async def test_a_short_conversation_is_not_compressed_and_nothing_changes(adb):
    await new_session(adb, "short", turns=4)
    before = await snapshot(adb)
    summarizer = Summarizer("s")
    with pytest.raises(NothingToCompress, match="nothing to compress"):
        await compress_session(adb, "short", summarizer, context_length=2_000)
    assert summarizer.requests == []
    assert await snapshot(adb) == before


async def test_a_failing_summarizer_changes_nothing_and_the_session_goes_on(adb):
    await new_session(adb, "s", turns=15)
    before = await snapshot(adb)
    summarizer = Summarizer()
    summarizer.error = ConnectionError("connection reset by peer")

    with pytest.raises(CompressionFailed, match="connection reset by peer") as info:
        await compress_session(adb, "s", summarizer, context_length=2_000)

    assert isinstance(info.value.__cause__, ConnectionError)
    assert await snapshot(adb) == before
    # The turn is still answered in the same session.
    await adb.messages.append_many("s", [{"role": "assistant", "content": "answered anyway"}])
    assert (await adb.messages.as_conversation(await adb.routes.get(KEY)))[-1]["content"] == "answered anyway"


async def test_a_hanging_summarizer_times_out_and_changes_nothing(adb):
    await new_session(adb, "s", turns=15)
    before = await snapshot(adb)
    summarizer = Summarizer("never sent")
    summarizer.release = asyncio.Event()  # never set: the model hangs

    with pytest.raises(CompressionFailed, match="did not answer within 0.2s"):
        await compress_session(adb, "s", summarizer, context_length=2_000, timeout=0.2)

    assert await snapshot(adb) == before


async def test_an_empty_summary_is_a_failure(adb):
    await new_session(adb, "s", turns=15)
    before = await snapshot(adb)
    with pytest.raises(CompressionFailed, match="empty summary"):
        await compress_session(adb, "s", Summarizer("   \n"), context_length=2_000)
    assert await snapshot(adb) == before


async def test_a_session_ended_meanwhile_is_left_alone(adb):
    await new_session(adb, "s", turns=15)
    summarizer = Summarizer("s")
    summarizer.release = asyncio.Event()
    task = asyncio.create_task(compress_session(adb, "s", summarizer, context_length=2_000))
    await summarizer.called.wait()
    await adb.sessions.end("s", "reset")  # e.g. /reset while the summary was being written
    before = await snapshot(adb)
    summarizer.release.set()
    with pytest.raises(SessionChanged, match="was ended"):
        await task
    assert await snapshot(adb) == before
    with pytest.raises(SessionChanged, match="already ended"):
        await compress_session(adb, "s", summarizer, context_length=2_000)


async def test_messages_stored_during_the_summary_are_carried_over(adb):
    await new_session(adb, "s", turns=15)
    summarizer = Summarizer("s")
    summarizer.release = asyncio.Event()
    task = asyncio.create_task(compress_session(adb, "s", summarizer, context_length=2_000))
    await summarizer.called.wait()
    await adb.messages.append_many("s", [{"role": "user", "content": "arrived mid-compression"}])
    summarizer.release.set()
    result = await task
    assert (await adb.messages.as_conversation(result.new_session_id))[-1]["content"] == "arrived mid-compression"
    assert (await adb.messages.as_conversation("s"))[-1]["content"] == "arrived mid-compression"
    assert result.messages_before == 31


async def test_other_sessions_are_served_while_one_compresses(adb):
    await new_session(adb, "slow", title="slow chat", key="telegram:dm:1", turns=15)
    await new_session(adb, "fast", title="fast chat", key="telegram:dm:2", turns=15)
    slow = Summarizer("slow summary")
    slow.release = asyncio.Event()
    pending = asyncio.create_task(compress_session(adb, "slow", slow, context_length=2_000))
    await slow.called.wait()

    # While "slow" waits for its summary, another chat is answered and even compressed.
    await adb.messages.append_many("fast", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    fast = await compress_session(adb, "fast", Summarizer("fast summary"), context_length=2_000)
    assert await adb.routes.get("telegram:dm:2") == fast.new_session_id
    assert not pending.done()
    assert await adb.routes.get("telegram:dm:1") == "slow"

    slow.release.set()
    done = await pending
    assert await adb.routes.get("telegram:dm:1") == done.new_session_id


def test_describe_is_the_compress_reply():
    result = CompressionResult("a", "b", "my project #2", KEY, 48, 11, 61_240, 9_180, "s")
    assert result.describe() == (
        'Compressed: 48 → 11 messages, ~61,000 → ~9,000 tokens. Continuing as "my project #2".'
    )
    untitled = CompressionResult("a", "b", None, None, 12, 10, 950, 87, "s")
    assert untitled.describe() == "Compressed: 12 → 10 messages, ~1,000 → ~87 tokens. Continuing in a new session."


async def test_a_summary_that_saves_nothing_changes_nothing(adb):
    await new_session(adb, "s", turns=12)
    before = await snapshot(adb)
    with pytest.raises(CompressionFailed, match="not shorter"):
        await compress_session(adb, "s", Summarizer("blah " * 20_000), context_length=2_000)
    assert await snapshot(adb) == before


async def test_a_timeout_raised_by_the_summarizer_itself_is_a_failure(adb):
    await new_session(adb, "s", turns=12)
    summarizer = Summarizer()
    summarizer.error = TimeoutError("read timed out")
    with pytest.raises(CompressionFailed, match="timed out"):
        await compress_session(adb, "s", summarizer, context_length=2_000, timeout=None)


async def test_a_split_that_goes_wrong_half_way_is_undone(adb):
    # The session is cleared while its summary is written: the store's one-transaction split
    # finds messages gone and writes nothing (no child, the route and the parent as they were).
    await new_session(adb, "s", turns=15)
    summarizer = Summarizer("s")
    summarizer.release = asyncio.Event()
    task = asyncio.create_task(compress_session(adb, "s", summarizer, context_length=2_000))
    await summarizer.called.wait()
    await adb.messages.clear("s")
    before = await snapshot(adb)
    summarizer.release.set()
    with pytest.raises(SessionChanged, match="lost messages"):
        await task
    assert await snapshot(adb) == before  # no child, route and parent untouched
    assert await adb.routes.get(KEY) == "s"


async def test_a_summary_longer_than_asked_for_is_cut_to_leave_the_room(adb):
    # a model that writes more than it was asked to must not cost the split (and the conversation its
    # history): the summary is cut at a word, its start (the newest request, the goals) kept
    await new_session(adb, "s", turns=15)
    summarizer = Summarizer("Latest user request: ship v2. " + "long " * 400)
    result = await compress_session(adb, "s", summarizer, context_length=2_000, max_tokens_after=1_100)
    assert result.tokens_after <= 1_100
    assert result.summary.startswith("Latest user request: ship v2.")
    stored = await adb.messages.as_conversation(result.new_session_id)
    assert "the rest of the summary was cut to fit the context window" in next(m for m in stored if is_summary(m))["content"]


async def test_a_split_that_cannot_leave_the_room_asked_for_does_not_ask_for_a_summary(adb):
    await new_session(adb, "s", turns=15)
    before = await snapshot(adb)
    summarizer = Summarizer("s")
    # even the smallest tail (the newest question and its answer) with the shortest summary is ~280 tokens
    with pytest.raises(TooLittleToGain, match="a split would save too little") as info:
        await compress_session(adb, "s", summarizer, context_length=2_000, max_tokens_after=200)
    assert summarizer.requests == [] and await snapshot(adb) == before
    assert info.value.tokens_after > info.value.limit == 200
