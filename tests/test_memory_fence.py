"""The memory fence never reaches a user: a ``<memory-context>`` block a model echoes is removed from
every answer before it is shown, sent or stored, and a streamed answer never shows any of it, not
even a partial tag for a moment; stored answers written before the fix are cleaned when read back.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gateway.memory.facts.prefetch import NOTE, memory_context
from gateway.runtime.daemon import Gateway
from state import SessionDB
from state.memory_fence import MEMORY_CLOSE, MEMORY_OPEN, FenceScrubber, strip_memory_fence
from tests.fakes.model_server import FakeModel, Reply
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, eventually, gateway_config, running_gateway
from tests.test_api_streaming import content, stream

BLOCK = f"{MEMORY_OPEN}\n{NOTE}\n- #3 Ann's favourite editor is Helix\n{MEMORY_CLOSE}"

# text a model writes around an echo: pieces of tags, whitespace, angle brackets that are not tags
_FRAGMENTS = st.sampled_from([
    MEMORY_OPEN, MEMORY_CLOSE, "<MEMORY-CONTEXT>", "</Memory-Context>", "<memory-", "</memory", "context>", "<", ">",
    "</", "<memory-contexts>", " ", "\n", "\n\n", "a", "Helix", "é", "🙂", "x<y", "<b>", "-",
])
TEXTS = st.lists(st.one_of(_FRAGMENTS, st.text(max_size=4)), max_size=30).map("".join)
# an answer with echoed blocks in it, its own text free of "<" (so any "<" shown is the fence's)
_PLAIN = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=12)
_INNER = st.text(max_size=12).filter(lambda t: MEMORY_CLOSE not in t.lower())
ECHOES = st.lists(st.one_of(_PLAIN, _INNER.map(lambda t: f"{MEMORY_OPEN}{t}{MEMORY_CLOSE}")), min_size=1,
                  max_size=8).map("".join)


_KEYS = itertools.count()


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def scrubbed(pieces: list[str]) -> list[str]:
    scrubber = FenceScrubber()
    return [scrubber.feed(p) for p in pieces] + [scrubber.finish()]


# -- the sanitiser ----------------------------------------------------------------------

def test_the_sanitiser_removes_blocks_and_stray_tags():
    assert strip_memory_fence(f"Use Helix.\n\n{BLOCK}") == "Use Helix.\n\n"
    assert strip_memory_fence(f"{BLOCK}\n\nUse Helix.") == "Use Helix."
    assert strip_memory_fence(f"A. {BLOCK} B.") == "A. B."
    assert strip_memory_fence("a </memory-context>b<memory-context>") == "a b"
    assert strip_memory_fence("<Memory-Context>x</MEMORY-CONTEXT>y") == "y"
    assert strip_memory_fence("a <b>bold</b> 1 < 2 <memory-contexts>") == "a <b>bold</b> 1 < 2 <memory-contexts>"
    assert strip_memory_fence(memory_context([])) == ""  # the block the prefetch builds, whole


@pytest.mark.slow  # 600 examples (about 18 s): make test runs it, make test-fast leaves it out
@settings(max_examples=600, deadline=None)
@given(text=TEXTS, cuts=st.lists(st.integers(0, 120), max_size=12))
@example(text=f"ok {MEMORY_OPEN}secret{MEMORY_CLOSE} done", cuts=list(range(40)))
@example(text="<memory-<memory-context>x</memory-context>context> ", cuts=[3, 9, 20])
def test_any_split_of_a_stream_shows_exactly_the_sanitised_whole(text, cuts):
    shown = scrubbed(split(text, cuts))
    assert "".join(shown) == strip_memory_fence(text)


@pytest.mark.slow  # 400 examples (about 8 s): make test runs it, make test-fast leaves it out
@settings(max_examples=400, deadline=None)
@given(text=ECHOES, cuts=st.lists(st.integers(0, 150), max_size=15))
def test_nothing_of_the_fence_is_ever_shown_even_for_a_moment(text, cuts):
    pieces = scrubbed(split(text, cuts))
    assert all("<" not in piece for piece in pieces), pieces  # the answer's own text holds no "<"
    assert "".join(pieces) == strip_memory_fence(text)


# -- the real path: model stream -> turn -> SSE and the store ---------------------------------

@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


@pytest.fixture
async def gateway(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        yield gw, api
        await api.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ECHOES.filter(lambda t: strip_memory_fence(t).strip()), cuts=st.lists(st.integers(0, 150), max_size=15))
async def test_an_api_stream_split_anywhere_shows_and_stores_the_sanitised_answer(gateway, model, text, cuts):
    gw, api = gateway
    key = next(_KEYS)  # a new conversation for each example
    model.script(Reply(text, chunks=tuple(split(text, cuts))))
    chunks = await stream(api, str(key), "which editor?")
    pieces = [c.choices[0].delta.content or "" for _, c in chunks if c.choices]
    assert all("<" not in p for p in pieces), pieces
    assert content(chunks) == strip_memory_fence(text)
    stored = await gw.db.messages.get(await gw.db.routes.get(f"agent:main:api:dm:{key}"))
    assert [m.content for m in stored if m.role == "assistant"] == [strip_memory_fence(text)]


async def test_a_plain_answer_that_echoes_the_block_is_sent_and_stored_without_it(gateway, model):
    gw, api = gateway
    model.script(Reply(f"{BLOCK}\n\nYour editor is Helix."))
    assert await api.say("plain", "which editor?") == "Your editor is Helix."
    stored = await gw.db.messages.get(await gw.db.routes.get("agent:main:api:dm:plain"))
    assert stored[-1].content == "Your editor is Helix."


async def test_a_telegram_stream_never_shows_a_tag_split_across_chunks(tmp_path):
    answer = f"Your editor is Helix, as you told me. {BLOCK}\n\nAnything else about your set-up today?"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.stream_interval = 0.03
        # word by word, and each tag split at every boundary a chunk could have (one character a chunk)
        before, after = answer.split(BLOCK)
        inner = BLOCK[len(MEMORY_OPEN):-len(MEMORY_CLOSE)]
        pieces = [*before.split(" "), *MEMORY_OPEN, inner, *MEMORY_CLOSE, *after.split(" ")]
        pieces = [p + " " for p in pieces[:len(before.split(" ")) - 1]] + pieces[len(before.split(" ")) - 1:]
        pieces[-len(after.split(" ")):] = [p + " " for p in after.split(" ")[:-1]] + [after.split(" ")[-1]]
        assert "".join(pieces) == answer
        model.script(Reply(answer, chunks=tuple(pieces)))
        ann = FakeTelegram.user(111, "Ann")
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                                streaming={"edit_interval_seconds": 0.25})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            tg.dm(ann, "which editor?")
            expected = strip_memory_fence(answer)
            await eventually(lambda: tg.sent and tg.sent[0].visible_text == expected, timeout=20, what="the final edit")
            shown = tg.calls("sendMessage") + tg.calls("editMessageText")
            assert len(shown) >= 3, "the answer was shown while it was written, before and after the block"
            for call in shown:
                text = call.get("text", "")
                assert "memory" not in text and "Recalled" not in text, text
                assert call.get("parse_mode") or "<" not in text, text  # a preview is plain text: no tag
            with SessionDB(gw.config.db_path) as db:
                [(_, session_id)] = list(db.routes.list())
                assert db.messages.get(session_id)[-1].content == expected
        finally:
            await gw.stop(grace_seconds=5)


# -- stored before the fix ----------------------------------------------------------------------

def test_a_stored_answer_written_before_the_fix_is_read_back_without_the_block(store):
    store.sessions.create("s1", "telegram")
    store.messages.append("s1", "user", "which editor?")
    store.messages.append("s1", "assistant", f"Helix.\n\n{BLOCK}")
    store.messages.append("s1", "user", f"quoting you: {MEMORY_OPEN}")  # a user's own words are theirs
    conversation = store.messages.as_conversation("s1")
    assert [m["content"] for m in conversation] == ["which editor?", "Helix.\n\n", f"quoting you: {MEMORY_OPEN}"]
