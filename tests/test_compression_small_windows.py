"""Compression on small windows with long turns, through the real gateway and the local API (issue #36).

The tail is up to six messages, fewer when the budget says so: a 4,000-token window with turns of
about 260 words is split (a ``#2`` child with the model's summary), where it used to be cut
oldest-first for ever.  A split that cannot make room is not made, and the user is told once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import compression
from gateway.oversize import max_message_tokens, shorten_oversized
from tests.fakes.model_server import FakeModel
from tests.harness import ApiClient, running_gateway

KEY = "agent:main:api:dm:k"
WORDS = ("the staging database migration needs a rollback plan before friday because the replica lags "
         "behind and the deploy scripts still point at the old host ").split()


def words(n: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(n))


def summarizing(summary: str):
    def respond(messages: list[dict]) -> str | None:
        if "write the memory" in (messages[0].get("content") or ""):
            return summary
        if "about to be compressed" in str(messages[-1].get("content")):
            return "nothing new to remember"
        return None

    return respond


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def say(api: ApiClient, text: str) -> tuple[str, str]:
    raw = await api.client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], extra_headers={"X-Session-Key": "k"})
    return raw.parse().choices[0].message.content or "", raw.headers.get("X-Switchboard-Notice", "")


async def test_a_4000_token_window_with_260_word_turns_is_split_into_a_titled_child(tmp_path, model):
    model.responder = summarizing("SUMMARY: the migration needs a rollback plan; the replica lags.")
    async with running_gateway(tmp_path, model, model={"context_length": 4000},
                               compression={"timeout_seconds": 5}) as gw:
        api = ApiClient(gw)
        assert await api.say("k", "/title migration") == "Session title set: migration"
        root = await gw.db.routes.get(KEY)
        split_at, notices = None, []
        for i in range(30):
            answer, notice = await say(api, f"turn {i}: {words(260, i)}")
            assert answer.startswith(f"echo: turn {i}:"), answer  # every turn answered
            notices.append(notice)
            if await gw.db.routes.get(KEY) != root:
                split_at = i
                break
        assert split_at is not None, notices
        child = await gw.db.routes.get(KEY)
        answer, _ = await say(api, "and what next?")
        await api.close()
        parent, row = await gw.db.sessions.get(root), await gw.db.sessions.get(child)
        stored = await gw.db.messages.get(child)
    assert parent.end_reason == "compression" and row.parent_session_id == root
    assert row.title == "migration #2"
    assert notices[split_at].startswith("Compressed: ") and 'Continuing as "migration #2".' in notices[split_at]
    summaries = [m for m in stored if compression.is_summary(m.as_dict())]
    assert len(summaries) == 1 and "SUMMARY: the migration needs a rollback plan" in summaries[0].content
    assert answer.startswith("echo: and what next?")  # the next turn is answered in the child
    assert [m.content for m in stored[-2:]] == ["and what next?", answer]
    assert not any("left out of this reply" in n for n in notices)  # split, never cut oldest-first first


async def test_a_1500_token_window_with_260_word_turns_never_loops_and_says_so_once(tmp_path, model):
    # a turn is larger than what the history may hold: no split can leave room for the next one, so
    # none is made (no summary asked for, no child a turn), and the user is told once
    model.responder = summarizing("SUMMARY")
    async with running_gateway(tmp_path, model, model={"context_length": 1500},
                               compression={"timeout_seconds": 5}) as gw:
        api = ApiClient(gw)
        turns = [await say(api, f"turn {i}: {words(260, i)}") for i in range(8)]
        await api.close()
        sessions = await gw.db.sessions.list_rich(include_children=True, limit=100)
    assert all(answer.startswith(f"echo: turn {i}:") for i, (answer, _) in enumerate(turns))
    assert len(sessions) == 1
    assert not any("write the memory" in str(r.messages[0].get("content")) for r in model.requests)
    told = [notice for _, notice in turns if "/new" in notice]
    assert len(told) == 1 and "model.context_length" in told[0], [n for _, n in turns]


async def test_a_window_smaller_than_one_message_is_said_once(tmp_path, model):
    model.responder = summarizing("SUMMARY")
    async with running_gateway(tmp_path, model, model={"context_length": 1024},
                               compression={"timeout_seconds": 5}) as gw:
        api = ApiClient(gw)
        turns = [await say(api, f"paste: {words(900)}")]
        turns += [await say(api, f"short {i}") for i in range(6)]
        await api.close()
        sessions = await gw.db.sessions.list_rich(include_children=True, limit=100)
        root = next(s["id"] for s in sessions if s["parent_session_id"] is None)
        stored = await gw.db.messages.get(root)
    assert turns[0][0].startswith("echo: paste:")
    assert all(answer.startswith(f"echo: short {i}") for i, (answer, _) in enumerate(turns[1:]))
    notices = [notice for _, notice in turns if notice]
    cut = [n for n in notices if "more than the model can read at once" in n]
    assert len(cut) == 1 and turns[0][1] == cut[0]  # said with the message it is about
    assert len([n for n in notices if "/new" in n]) <= 1, notices
    assert stored[0].content == f"paste: {words(900)}"  # the store keeps it whole


# --- the property: a split leaves the child under the threshold, or the user is told -------------

def _asked_tokens(request: list[dict]) -> int:
    body = request[-1]["content"]
    return int(body.split("in about ", 1)[1].split(" tokens", 1)[0].replace(",", ""))


async def _prepare_once(tmp: Path, sizes: list[int], window: int, overhead: int, overshoot: float):
    from compression import estimate_tokens, prepare_history
    from state import AsyncSessionDB

    db = await AsyncSessionDB.open(tmp / "state.db")
    try:
        await db.sessions.create("s", "api", "m", "u", session_key="k")
        await db.routes.set("k", "s")
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(n, i)}
                   for i, n in enumerate(sizes)]
        if history[-1]["role"] != "user":
            history.append({"role": "user", "content": words(sizes[0])})
        await db.messages.append_many("s", history)

        async def summarize(request: list[dict]) -> str:  # a model that writes a little more than asked
            return words(max(1, int(_asked_tokens(request) * overshoot * 3.5 / 6)))

        # as a turn sends it: one message never takes more than half the window (model.max_message_share)
        shortened = shorten_oversized(history, max_message_tokens(window, 0.5))
        prepared = await prepare_history(db, "s", shortened.messages, summarize, context_length=window,
                                         overhead_tokens=overhead, reserve_tokens=window // 4)
        before = estimate_tokens(shortened.messages) + overhead
        told = [*shortened.notices, *([prepared.notice] if prepared.notice else [])]
        return prepared, before, estimate_tokens(prepared.history) + overhead, told
    finally:
        await db.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(1, 1_200), min_size=2, max_size=40), st.sampled_from([1_024, 1_500, 2_048, 4_000, 8_000]),
       st.integers(0, 400), st.sampled_from([0.5, 1.0, 1.5]))
def test_after_a_split_the_child_is_under_the_threshold_or_the_user_was_told(tmp_path_factory, sizes, window,
                                                                          overhead, overshoot):
    tmp = tmp_path_factory.mktemp("p")
    prepared, before, after, told = asyncio.run(_prepare_once(tmp, sizes, window, overhead, overshoot))
    if before < 0.75 * window:
        assert prepared.compressed is None and prepared.notice is None
    elif prepared.compressed is not None:
        assert after < 0.75 * window, (before, after, prepared.compressed)
    else:  # no split: the prompt is as it was and fits, or the user is told what was left out
        assert told or (prepared.dropped == 0 and after <= window), prepared
