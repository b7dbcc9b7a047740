"""Voice in and out on Telegram, end to end: fake Telegram <-> real python-telegram-bot <-> our adapter <->
the real gateway <-> the real ``openai`` SDK <-> the fake model server's chat and audio endpoints.

What the user sees is asserted on the fake Telegram (messages, voice notes, chat actions), what the
model and the audio API were sent on the fake model server, and what is kept in state.db.
"""

from __future__ import annotations

import asyncio

import pytest

import state
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import Fail, FakeModel, Held
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config
from tests.voicekit import ogg_opus

ANN = FakeTelegram.user(111, "Ann")
KEY = "agent:main:telegram:dm:111"
MEDIA = {"transcribe_with": "whisper-1", "speak_with": "tts-1", "voice": "nova", "max_audio_seconds": 60}


def _config(tmp_path, tg, model, **overrides):
    return gateway_config(
        tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
        platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}}, media=MEDIA, **overrides)


async def _started(config, *, daemon: bool = False) -> Gateway:
    """The gateway; ``daemon``: as the daemon runs it (the API served, what a stop left undone resumed)."""
    gw = Gateway(config, serve_api=daemon)
    await gw.start()
    return gw


@pytest.fixture
async def world(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = _config(tmp_path, tg, model)
        gw = await _started(config)
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            yield tg, model, gw, config
        finally:
            await gw.stop(grace_seconds=5)


def _user_messages(config) -> list[str]:
    with state.SessionDB(config.db_path) as db:
        session = db.routes.session(KEY)
        assert session is not None
        return [m.content for m in db.messages.get(session["id"]) if m.role == "user"]


def _voice(tg: FakeTelegram, file_id: str, seconds: float, *, duration: int | None = None, **kw) -> dict:
    return tg.dm(ANN, None, voice=tg.voice_note(file_id, ogg_opus(seconds), duration=duration), **kw)


async def test_a_voice_note_becomes_a_turn_on_its_transcript(world):
    tg, model, gw, config = world
    model.transcript = "remind me to water the plants"
    model.transcribe_delay = 0.3
    _voice(tg, "v1", 4, duration=4)
    [answer] = await tg.wait_for_sent(1, timeout=10)
    await tg.wait_for(lambda: "echo:" in answer.visible_text, what="the answer")
    # the user saw the transcribing state while the endpoint worked, then the answer in its place
    shown = [r.params.get("text") for r in tg.requests if r.method == "sendMessage"]
    assert shown[0] == "transcribing…"
    assert answer.visible_text.startswith("echo: [voice message, transcribed]\nremind me to water the plants")
    # the transcription request: the model named in media.transcribe_with, the note's own bytes
    [request] = model.transcriptions
    assert request["model"] == "whisper-1"
    assert request["file"]["data"] == ogg_opus(4) and request["file"]["filename"] == "voice.ogg"
    [chat] = model.requests
    assert chat.last_user_text == "[voice message, transcribed]\nremind me to water the plants"
    # stored: the transcript is the message's text, marked
    assert _user_messages(config) == ["[voice message, transcribed]\nremind me to water the plants"]


async def test_voice_notes_that_arrive_during_a_turn_are_answered_together_each_on_its_own_transcript(world):
    tg, model, gw, config = world
    release = asyncio.Event()
    model.script(Held(release))
    tg.dm(ANN, "first")
    await model.wait_for_requests(1)
    model.transcripts = ["one", "two"]
    for file_id in ("a", "b"):  # alike: the same length, size and name
        update = _voice(tg, file_id, 3, duration=3)
    await tg.wait_until_confirmed(update)
    release.set()
    await model.wait_for_requests(2)
    second = model.requests[1].messages
    assert [m["content"] for m in second if m["role"] == "user"][-2:] == [
        "[voice message, transcribed]\none", "[voice message, transcribed]\ntwo"]
    assert _user_messages(config) == ["first", "[voice message, transcribed]\none",
                                      "[voice message, transcribed]\ntwo"]


async def test_without_streaming_the_typing_indicator_shows_while_transcribing(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        gw = await _started(_config(tmp_path, tg, model, streaming={"enabled": False}))
        try:
            model.transcribe_delay = 0.3
            _voice(tg, "v1", 3, duration=3)
            [answer] = await tg.wait_for_sent(1, timeout=10)
        finally:
            await gw.stop(grace_seconds=5)
    assert answer.visible_text.startswith("echo: [voice message, transcribed]\nhello from a voice note")
    actions = [r for r in tg.requests if r.method == "sendChatAction"]
    assert actions and actions[0].params["action"] == "typing"
    assert actions[0].at < model.transcriptions[0]["answered"]  # shown while the endpoint worked


async def test_a_failed_transcription_gets_one_line_and_the_message_is_kept(world):
    tg, model, gw, config = world
    model.transcribe_fail = Fail(500, message="decoder crashed")
    _voice(tg, "v1", 5, duration=5)
    [line] = await tg.wait_for_sent(1, timeout=10)
    await tg.wait_for(lambda: "transcribe" in line.visible_text, what="the line")
    assert line.visible_text.startswith("I could not transcribe your voice message (the transcription endpoint "
                                        "failed (500)). It is saved;")
    assert "decoder crashed" not in line.visible_text  # the endpoint's own words are not passed on
    assert model.requests == []  # no turn on a message without words
    [kept] = _user_messages(config)
    assert kept == "[voice message voice.ogg, audio/ogg, 2 KB, 5 s: could not be transcribed]"
    # the next message is answered with the voice message, described, in the history
    model.transcribe_fail = None
    tg.dm(ANN, "did you get it?")
    sent = await tg.wait_for_sent(2, timeout=10)
    await tg.wait_for(lambda: "echo: did you get it?" in sent[1].visible_text, what="the answer")
    assert "could not be transcribed" in model.requests[0].messages[-2]["content"]


async def test_audio_longer_than_the_limit_is_refused_politely(world):
    tg, model, gw, config = world
    _voice(tg, "long", 2, duration=150)  # Telegram's own duration says 2 min 30 s; the limit is 60 s
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, None, voice=tg.voice_note("long2", ogg_opus(90)))  # no duration given: read from the file
    sent = await tg.wait_for_sent(2, timeout=10)
    await tg.wait_for(lambda: all("long" in s.visible_text for s in sent), what="the refusals")
    assert model.transcriptions == [] and model.requests == []
    assert [s.visible_text for s in sent] == [
        "Your voice message is 2 min 30 s long; I transcribe up to 1 min. Please send a shorter one, or type it.",
        "Your voice message is 1 min 30 s long; I transcribe up to 1 min. Please send a shorter one, or type it."]
    assert _user_messages(config) == [
        "[voice message voice.ogg, audio/ogg, 2 KB, 2 min 30 s: not transcribed, longer than the 1 min limit]",
        "[voice message voice.ogg, audio/ogg, 2 KB, 1 min 30 s: not transcribed, longer than the 1 min limit]"]


async def test_voice_on_sends_the_reply_spoken_beside_its_text_and_voice_off_stops_it(world):
    tg, model, gw, config = world
    tg.dm(ANN, "/voice on")
    [said] = await tg.wait_for_sent(1, timeout=10)
    assert said.visible_text == "Replies here now also come as a voice message, with their text beside it."
    tg.dm(ANN, "read me a **poem**")
    sent = await tg.wait_for_sent(2, timeout=10)
    await tg.wait_for(lambda: len(tg.voices) == 1, what="the voice message")
    assert sent[1].visible_text == "echo: read me a poem | turns: 1 | first: read me a poem"  # the text stays
    [speech] = model.speeches
    assert speech == {"model": "tts-1", "voice": "nova", "response_format": "opus",
                      "input": "echo: read me a poem | turns: 1 | first: read me a poem"}
    [voice] = tg.voices
    assert voice.chat_id == 111 and voice.data == model.speech_audio
    assert tg.requests.index(next(r for r in tg.requests if r.method == "sendVoice")) > \
        tg.requests.index(next(r for r in tg.requests if r.params.get("text", "").startswith("echo")))

    tg.dm(ANN, "/voice off")
    tg.dm(ANN, "and now?")
    sent = await tg.wait_for_sent(4, timeout=10)
    await tg.wait_for(lambda: "echo: and now?" in sent[3].visible_text, what="the answer")
    assert sent[2].visible_text == "Replies here now come as text only."
    assert len(tg.voices) == 1 and len(model.speeches) == 1


async def test_a_failed_speech_call_still_delivers_the_text(world):
    tg, model, gw, config = world
    tg.dm(ANN, "/voice on")
    await tg.wait_for_sent(1, timeout=10)
    model.speech_fail = Fail(503, message="tts down")
    tg.dm(ANN, "hello")
    sent = await tg.wait_for_sent(2, timeout=10)
    await tg.wait_for(lambda: len(model.speeches) >= 1, what="the speech call")
    assert sent[1].visible_text.startswith("echo: hello")
    marker = tg.dm(ANN, "marker")
    await tg.wait_for_sent(3, timeout=10)
    await tg.wait_until_confirmed(marker)
    assert tg.voices == [] and tg.calls("sendVoice") == []


async def test_the_voice_choice_survives_a_restart(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = _config(tmp_path, tg, model)
        gw = await _started(config)
        try:
            tg.dm(ANN, "/voice on")
            await tg.wait_for_sent(1, timeout=10)
        finally:
            await gw.stop(grace_seconds=5)
        gw = await _started(config)
        try:
            tg.dm(ANN, "still speaking?")
            await tg.wait_for_sent(2, timeout=10)
            await tg.wait_for(lambda: len(tg.voices) == 1, what="the voice message")
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_stop_between_storing_and_transcribing_is_transcribed_and_answered_after_restart(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = _config(tmp_path, tg, model)
        model.transcribe_delay = 30  # the endpoint hangs: the gateway stops while it waits
        gw = await _started(config, daemon=True)
        try:
            update = _voice(tg, "v1", 4, duration=4)
            await tg.wait_until_confirmed(update)  # stored: the platform may forget it
            await tg.wait_for(lambda: len(model.transcriptions) == 1, what="the transcription request")
        finally:
            await gw.stop(grace_seconds=0.2)
        assert _user_messages(config) == ["[voice message voice.ogg, audio/ogg, 2 KB, 4 s: waiting for its transcript]"]
        answered_before = [s.visible_text for s in tg.sent if s.visible_text != "transcribing…"]
        model.transcribe_delay = 0
        model.transcript = "water the plants on Friday"
        gw = await _started(config, daemon=True)  # a new process: the audio is read back from the media folder
        try:
            await tg.wait_for(lambda: any("echo:" in s.visible_text for s in tg.sent), timeout=10,
                              what="the answer after the restart")
        finally:
            await gw.stop(grace_seconds=5)
        assert answered_before == []
        [answer] = [s for s in tg.sent if "echo:" in s.visible_text]
        assert answer.visible_text.startswith("echo: [voice message, transcribed]\nwater the plants on Friday")
        assert not any("send it again" in s.visible_text for s in tg.sent)
        # the note's own bytes went to the endpoint again, and the model was asked about its transcript
        assert [t["file"]["data"] for t in model.transcriptions] == [ogg_opus(4), ogg_opus(4)]
        [chat] = model.requests
        assert chat.last_user_text == "[voice message, transcribed]\nwater the plants on Friday"
        assert _user_messages(config) == ["[voice message, transcribed]\nwater the plants on Friday"]


async def test_clustered_a_voice_note_claimed_on_the_other_instance_is_transcribed_there_from_the_shared_media(
        tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel() as model:
        def instance(name: str):
            return gateway_config(
                tmp_path / name, model.base_url, auth={"allowed_users": ["telegram:111"]},
                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                media={**MEDIA, "path": str(tmp_path / "shared-media")},
                store={"url": pg_url}, cluster={"instance_id": name, "lease_seconds": 3})

        a, b = instance("a"), instance("b")
        assert a.clustered and a.media_path == b.media_path and a.home != b.home
        # a alone stores the note and claims its session; b starts meanwhile; a stops while it transcribes
        model.transcribe_delay = 30
        gw_a = await _started(a, daemon=True)
        gw_b, a_running = None, True
        try:
            await tg.wait_for(lambda: gw_a.health()["platforms"]["telegram"]["state"] == "connected", timeout=10,
                              what="a connected")
            update = _voice(tg, "v1", 4, duration=4)
            await tg.wait_until_confirmed(update)
            await tg.wait_for(lambda: len(model.transcriptions) == 1, timeout=10, what="a transcribing")
            gw_b = await _started(b, daemon=True)  # stands by for the connection, and claims sessions' turns
            model.transcribe_delay = 0
            a_running = False
            await gw_a.stop(grace_seconds=0.2)  # its lease goes back: b claims the session, without the audio
            await tg.wait_for(lambda: any("echo:" in s.visible_text for s in tg.sent), timeout=20,
                              what="the answer from b")
            claimed = gw_b.health()["cluster"]["claims"]["turns_claimed"]
        finally:
            if a_running:
                await gw_a.stop(grace_seconds=0.2)
            if gw_b is not None:
                await gw_b.stop(grace_seconds=5)
    assert claimed >= 1
    [answer] = [s for s in tg.sent if "echo:" in s.visible_text]
    assert answer.visible_text.startswith("echo: [voice message, transcribed]\nhello from a voice note")
    assert not any("send it again" in s.visible_text for s in tg.sent)
    assert [t["file"]["data"] for t in model.transcriptions] == [ogg_opus(4), ogg_opus(4)]
    [chat] = model.requests
    assert chat.last_user_text == "[voice message, transcribed]\nhello from a voice note"
