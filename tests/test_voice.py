"""gateway.voice on its own: how long a clip is, what a voice message's stored text says, what is read
aloud, the ``media:`` voice keys; and the audio client against the fake model server (the real SDK)."""

from __future__ import annotations

import pytest

from gateway.config import config_from_dict
from gateway.errors import ConfigError, ModelRefused, ModelUnavailable
from gateway.types import Attachment
from gateway.voice import (
    Voice,
    VoiceSettings,
    audio_seconds,
    describe,
    is_pending,
    pending_line,
    spoken_text,
    stated_seconds,
    transcribe_stored,
)
from tests.fakes.model_server import Fail, FakeModel
from tests.voicekit import ogg_opus, wav


def clip(data: bytes | None, *, name: str = "voice.ogg", duration: float | None = None) -> Attachment:
    return Attachment(kind="audio", name=name, mime_type="audio/ogg", data=data, duration=duration)


@pytest.mark.parametrize("data, seconds", [
    (ogg_opus(7.5), 7.5),
    (ogg_opus(0.25), 0.25),
    (wav(3.0), 3.0),
    (wav(1.5, rate=16000), 1.5),
])
def test_the_length_is_read_from_an_ogg_or_wav_header(data, seconds):
    assert audio_seconds(clip(data)) == pytest.approx(seconds, abs=0.01)


@pytest.mark.parametrize("data", [b"ID3\x04 an mp3", b"OggS", b"OggS" + b"\x00" * 30, b"RIFF\x00\x00\x00\x00WAVE",
                                  ogg_opus(5)[:40], b""])
def test_an_unknown_or_broken_header_gives_no_length_and_no_error(data):
    assert audio_seconds(clip(data)) is None


def test_the_platforms_duration_comes_first():
    assert audio_seconds(clip(ogg_opus(5), duration=42)) == 42


def test_a_waiting_voice_message_says_what_the_audio_is():
    line = pending_line(clip(ogg_opus(4), name="note]\nx.ogg"))
    assert line == "[voice message note  x.ogg, audio/ogg, 2 KB, 4 s: waiting for its transcript]"
    assert is_pending(f"caption\n{line}") and not is_pending("[voice message, transcribed]\nhello")
    assert describe(clip(None, duration=125)) == "voice.ogg, audio/ogg, 2 min 5 s"


def test_what_is_read_aloud_leaves_markdown_out_and_keeps_within_the_limit():
    assert spoken_text("**Bold** and [a link](https://x.test) with `code`\n```py\nprint(1)\n```") == \
        "Bold and a link with code\nprint(1)"
    assert len(spoken_text("word " * 2000)) == 4096
    assert spoken_text("**") == "(no text)"


def test_the_voice_keys_have_defaults_and_refuse_nonsense(tmp_path):
    cfg = config_from_dict({"home": str(tmp_path)})
    assert (cfg.media.transcribe_with, cfg.media.speak_with, cfg.media.voice, cfg.media.max_audio_seconds) == \
        (None, None, "alloy", 300.0)
    with pytest.raises(ConfigError, match="media.max_audio_seconds"):
        config_from_dict({"home": str(tmp_path), "media": {"max_audio_seconds": 0}})
    with pytest.raises(ConfigError, match="media.transcribe"):
        config_from_dict({"home": str(tmp_path), "media": {"transcribe": "whisper-1"}})


async def test_the_client_transcribes_and_speaks_through_the_real_sdk():
    async with FakeModel() as model:
        voice = Voice(VoiceSettings(model.base_url, "sk-test", transcribe_with="whisper-1", speak_with="tts-1"))
        try:
            model.transcript = "  hello there  "
            transcript = await voice.transcribe(clip(ogg_opus(2)))
            assert (transcript.text, transcript.seconds) == ("hello there", 2.0)
            assert await voice.speak("Say **this**") == model.speech_audio
            assert model.speeches[0]["input"] == "Say this"
            model.transcribe_fail = Fail(401, message="Incorrect API key provided: sk-test", type="auth")
            with pytest.raises(ModelRefused) as refused:
                await voice.transcribe(clip(ogg_opus(2)))
            assert "sk-test" not in str(refused.value)  # the endpoint's words (which may quote the key) stay out
            model.speech_fail = Fail(503)
            with pytest.raises(ModelUnavailable, match=r"the speech endpoint failed \(503\)"):
                await voice.speak("hi")
        finally:
            await voice.close()


async def test_each_waiting_voice_message_gets_its_own_transcript_or_line():
    async with FakeModel() as model:
        voice = Voice(VoiceSettings(model.base_url, "", transcribe_with="whisper-1", max_audio_seconds=10))
        try:
            short, long = clip(ogg_opus(3), name="a.ogg"), clip(ogg_opus(30), name="b.ogg")
            stored = f"look\n{pending_line(short)}\n{pending_line(long)}"
            heard = await transcribe_stored(voice, stored, (short, long))
            assert heard.text == ("look\n[voice message, transcribed]\nhello from a voice note\n"
                                  "[voice message b.ogg, audio/ogg, 2 KB, 30 s: not transcribed, longer than the "
                                  "10 s limit]")
            assert heard.problems == ("Your voice message is 30 s long; I transcribe up to 10 s. Please send a "
                                      "shorter one, or type it.",)
            assert (heard.transcribed, heard.answerable) == (1, True)
            lost = await transcribe_stored(voice, pending_line(short), ())  # its audio is in no store
            assert lost.answerable is False and lost.text.endswith("not transcribed, its audio was not kept]")
            assert lost.problems == ("I lost the audio of your voice message before I could transcribe it. "
                                     "Please send it again.",)
            # read back from the media store (no duration): the platform's length the placeholder states
            # counts, not the header's 3 s
            said_90 = clip(ogg_opus(3), duration=90)
            again = await transcribe_stored(voice, pending_line(said_90), (clip(ogg_opus(3)),))
            assert again.text.endswith("1 min 30 s: not transcribed, longer than the 10 s limit]")
            assert len(model.transcriptions) == 1
        finally:
            await voice.close()


def test_a_voice_messages_text_is_set_once_known_and_recall_finds_it(store):
    store.sessions.create("s1", "telegram")
    waiting = store.messages.append("s1", "user", pending_line(clip(ogg_opus(3))))
    answer = store.messages.append("s1", "assistant", "an answer")
    assert store.voice.set_text(waiting, "[voice message, transcribed]\nthe zucchini harvest") is True
    assert store.voice.set_text(answer, "not a user message") is False  # only a user's message is ever rewritten
    assert store.voice.set_text(999_999, "nothing") is False
    assert [m.content for m in store.messages.get("s1")] == [
        "[voice message, transcribed]\nthe zucchini harvest", "an answer"]
    assert [m["id"] for m in store.search.messages("zucchini")] == [waiting]
    assert store.search.messages("transcript") == []  # the placeholder's words are gone from the index


@pytest.mark.parametrize("desc, seconds", [
    ("voice.ogg, audio/ogg, 2 KB, 4 s", 4.0),
    ("voice.ogg, audio/ogg, 2 KB, 1 min 30 s", 90.0),
    ("voice.ogg, audio/ogg, 2 KB, 5 min", 300.0),
    ("voice.ogg, audio/ogg, 2 KB", None),
    ("voice.ogg", None),
])
def test_the_length_a_placeholder_states_is_read_back(desc, seconds):
    assert stated_seconds(desc) == seconds
