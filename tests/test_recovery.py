"""After any stop, nothing acknowledged is left unanswered and no reply is sent twice.

The real gateway and Telegram adapter run against the fake Telegram and the fake model.  A
stop is either a real one (a turn cut off by the shutdown grace period) or a database left
the way a SIGKILL leaves it (a reply stored with its pending delivery, not yet confirmed);
the subprocess kill tests are in test_crash_recovery.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
import pytest

import state
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import Fail, FakeModel, Hang, Held
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config
from tests.waiting import eventually

ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
ANN_KEY = "agent:main:telegram:dm:111"


@pytest.fixture
async def fakes():
    async with FakeTelegram() as tg, FakeModel() as model:
        yield tg, model


def config_for(home, tg, fake_model, **extra):
    return gateway_config(home, fake_model.base_url, auth={"allowed_users": ["telegram:111", "telegram:222"]},
                          platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}}, **extra)


async def started(config) -> Gateway:
    gw = Gateway(config)
    await gw.start()
    return gw


async def test_a_turn_cut_off_by_shutdown_is_answered_after_the_restart(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model)
    model.script(Hang(30))
    gw = await started(config)
    try:
        tg.dm(ANN, "are you there?")
        await model.wait_for_requests(1)
    finally:
        await gw.stop(grace_seconds=0.2)  # the turn is cancelled: no answer was stored or sent
    assert tg.sent == []
    gw = await started(config)
    try:
        [reply] = await tg.wait_for_sent(1, timeout=10)
        assert reply.chat_id == 111 and reply.visible_text.startswith("echo: are you there? | turns: 1")
        tg.dm(ANN, "and now?")  # the session goes on: the resumed turn is part of its history
        second = (await tg.wait_for_sent(2, timeout=10))[1]
        assert "echo: and now? | turns: 2" in second.visible_text
    finally:
        await gw.stop(grace_seconds=5)
    with state.SessionDB(config.db_path) as db:
        assert db.recovery.counts()["unanswered"] == 0


async def test_messages_that_arrived_during_the_cut_off_turn_are_answered_together(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model)
    model.script(Hang(30), Hang(30))
    gw = await started(config)
    try:
        tg.dm(ANN, "first")
        tg.dm(BOB, "hello from Bob")  # another chat: its own turn
        await model.wait_for_requests(2)
        tg.dm(ANN, "second")
        await tg.wait_for(lambda: _stored_user_texts(config) >= 3, what="three messages stored")
    finally:
        await gw.stop(grace_seconds=0.2)
    assert tg.sent == []
    requests_before = len(model.requests)
    gw = await started(config)
    try:
        sent = await tg.wait_for_sent(2, timeout=10)
    finally:
        await gw.stop(grace_seconds=5)
    by_chat = {s.chat_id: s.visible_text for s in sent}
    assert by_chat[111].startswith("echo: second | turns: 2 | first: first")  # one turn for both of Ann's
    assert by_chat[222].startswith("echo: hello from Bob | turns: 1")
    assert len(model.requests) - requests_before == 2
    assert len(tg.sent) == 2


async def test_a_stored_reply_not_yet_sent_is_sent_once_without_asking_the_model_again(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model)
    crashed_after_the_answer(config, "hello", "the stored answer")
    gw = await started(config)
    try:
        [reply] = await tg.wait_for_sent(1, timeout=10)
        await tg.wait_for(lambda: not _pending(config), what="the delivery confirmed")
    finally:
        await gw.stop(grace_seconds=5)
    assert reply.visible_text == "the stored answer" and reply.chat_id == 111
    assert model.requests == []
    gw = await started(config)  # a second restart sends nothing again
    try:
        tg.dm(ANN, "next")
        sent = await tg.wait_for_sent(2, timeout=10)
    finally:
        await gw.stop(grace_seconds=5)
    assert [s.visible_text.split(" | ")[0] for s in sent] == ["the stored answer", "echo: next"]


async def test_a_long_reply_goes_on_from_the_first_part_not_confirmed(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model)
    long_answer = "\n\n".join(f"paragraph {i} " + "x" * 900 for i in range(8))  # two Telegram messages
    crashed_after_the_answer(config, "tell me a lot", long_answer, confirmed=["9001"])
    gw = await started(config)
    try:
        [second_part] = await tg.wait_for_sent(1, timeout=10)
        await tg.wait_for(lambda: not _pending(config), what="the delivery confirmed")
    finally:
        await gw.stop(grace_seconds=5)
    assert "paragraph 0" not in second_part.visible_text and "paragraph 7" in second_part.visible_text
    with state.SessionDB(config.db_path) as db:
        [record] = db.recovery.list_deliveries(_session_id(config))
    assert record.status == "sent" and record.sent_ids == ("9001", str(second_part.message_id))


async def test_an_old_unanswered_message_gets_one_line_instead_of_a_blind_answer(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model, sessions={"resume_within": "30m"})
    two_hours_ago = time.time() - 7200
    crashed_before_the_answer(config, "is the server down?", received_at=two_hours_ago)
    for _ in range(2):  # told once: a second restart says nothing more
        gw = await started(config)
        try:
            await tg.wait_for(lambda: not _pending(config) and _unanswered(config) == 0, what="settled")
        finally:
            await gw.stop(grace_seconds=5)
    [line] = tg.sent
    # "14:02" today, "Mon 21 Nov 14:02" when two hours ago was yesterday (a run just after midnight UTC)
    same_day = time.gmtime(two_hours_ago)[:3] == time.gmtime()[:3]
    when = time.strftime("%H:%M" if same_day else "%a %d %b %H:%M", time.gmtime(two_hours_ago))
    assert line.visible_text == (f"I restarted and did not answer your message from {when}. "
                                 "Send it again if it still matters.")
    assert model.requests == []


async def test_a_model_failure_is_told_once_and_not_retried_by_a_restart(tmp_path, fakes):
    tg, model = fakes
    config = config_for(tmp_path / "home", tg, model, model={"max_retries": 0})
    model.script(Fail(500))
    gw = await started(config)
    try:
        tg.dm(ANN, "hello")
        [line] = await tg.wait_for_sent(1, timeout=10)
    finally:
        await gw.stop(grace_seconds=5)
    assert "model is unavailable" in line.visible_text
    gw = await started(config)
    try:
        tg.dm(ANN, "again")
        sent = await tg.wait_for_sent(2, timeout=10)
    finally:
        await gw.stop(grace_seconds=5)
    assert sent[1].visible_text.startswith("echo: again | turns: 2")  # the restart did not answer "hello" alone
    assert len(tg.sent) == 2


# --- a database as a kill leaves it ------------------------------------------------------


def crashed_before_the_answer(config, text: str, *, received_at: float | None = None) -> int:
    """Ann's message stored and acknowledged, the daemon killed before the turn stored anything."""
    received_at = received_at or time.time()
    with state.SessionDB(config.db_path) as db:
        sid = state.new_session_id()
        db.sessions.create(sid, "telegram", model="fake-model", user_id="111", session_key=ANN_KEY)
        db.routes.set(ANN_KEY, sid)
        appended = db.messages.append_inbound(sid, text, platform_message_id="500", timestamp=received_at, inbox={
            "session_key": ANN_KEY, "platform": "telegram", "chat_id": "111", "chat_type": "dm", "user_id": "111",
            "user_name": "Ann", "platform_message_id": "500", "received_at": received_at})
        return appended.id


def crashed_after_the_answer(config, question: str, answer: str, *, confirmed: list[str] = ()) -> None:
    """The turn stored its answer with a pending delivery; the kill came before the send was confirmed."""
    message_id = crashed_before_the_answer(config, question)
    with state.SessionDB(config.db_path) as db:
        sid = db.routes.get(ANN_KEY)
        delivery_id = uuid.uuid4().hex
        db.messages.record_turn(sid, [{"role": "assistant", "content": answer}], answered=[message_id],
                                delivery=state.DeliveryRecord(delivery_id, "telegram", "111", reply_to="500", text=answer))
        if confirmed:
            db.recovery.update_delivery(delivery_id, sent_ids=list(confirmed), status="pending")


def _session_id(config) -> str:
    with state.SessionDB(config.db_path) as db:
        return db.routes.get(ANN_KEY)


def _pending(config) -> int:
    with state.SessionDB(config.db_path) as db:
        return db.recovery.counts()["deliveries_pending"]


def _unanswered(config) -> int:
    with state.SessionDB(config.db_path) as db:
        return db.recovery.counts()["unanswered"]


def _stored_user_texts(config) -> int:
    with state.SessionDB(config.db_path) as db:
        return sum(1 for s in db.sessions.list_rich() for m in db.messages.get(s["id"]) if m.role == "user")


async def test_healthz_and_metrics_show_a_session_awaiting_its_answer_and_for_how_long(tmp_path, fakes):
    tg, model = fakes
    release = asyncio.Event()
    model.script(Held(release))
    gw = await started(config_for(tmp_path / "home", tg, model))
    base = f"http://127.0.0.1:{gw.api.bound_port}"
    try:
        async with aiohttp.ClientSession() as http:
            async def unanswered_when(ok) -> dict | None:
                async with http.get(base + "/healthz") as r:
                    status = (await r.json())["unanswered"]
                return status if ok(status) else None

            async def metrics() -> str:
                async with http.get(base + "/metrics") as r:
                    return await r.text()

            first = await eventually(lambda: unanswered_when(lambda s: s["sessions"] is not None), timeout=10,
                                     every=0.1, what="the first read of the inbox")
            assert first == {"sessions": 0, "oldest_seconds": None}
            tg.dm(ANN, "are you there?")
            await model.wait_for_requests(1)  # the turn runs; the model holds its answer
            waiting = await eventually(lambda: unanswered_when(lambda s: s["sessions"]), timeout=10, every=0.2,
                                       what="/healthz counting Ann's session")
            assert waiting["sessions"] == 1 and waiting["oldest_seconds"] >= 0
            later = waiting["oldest_seconds"] + 0.5
            older = await eventually(lambda: unanswered_when(lambda s: s["oldest_seconds"] >= later), timeout=10,
                                     every=0.2, what="the oldest unanswered message's age growing")
            assert older["sessions"] == 1
            text = await metrics()
            assert "switchboard_unanswered_sessions 1.0" in text
            assert "switchboard_oldest_unanswered_seconds 0.0" not in text
            assert "switchboard_oldest_unanswered_seconds " in text
            release.set()
            [reply] = await tg.wait_for_sent(1, timeout=10)
            assert reply.visible_text.startswith("echo: are you there?")
            done = await eventually(lambda: unanswered_when(lambda s: s["sessions"] == 0), timeout=10, every=0.2,
                                    what="/healthz counting no session after the answer")
            assert done == {"sessions": 0, "oldest_seconds": None}
            assert "switchboard_unanswered_sessions 0.0" in await metrics()
    finally:
        release.set()
        await gw.stop(grace_seconds=5)
