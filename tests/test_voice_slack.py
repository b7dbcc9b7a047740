"""Voice in and out on Slack, end to end: fake Slack <-> real slack-bolt / slack_sdk <-> our adapter <-> the real
gateway <-> the real ``openai`` SDK <-> the fake model server's chat and audio endpoints."""

from __future__ import annotations

import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import Fail, FakeModel
from tests.fakes.slack import FakeSlack
from tests.harness import eventually, gateway_config
from tests.voicekit import wav


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def world(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                 "api_base_url": slack.base_url}},
            media={"transcribe_with": "whisper-1", "speak_with": "tts-1"}, streaming={"enabled": False})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()
            yield slack, model, gw
        finally:
            await gw.stop(grace_seconds=5)


async def test_an_audio_file_becomes_a_turn_on_its_transcript(world):
    slack, model, gw = world
    model.transcript = "book a room for friday"
    clip = slack.add_file("F9", wav(3), name="clip.wav", mimetype="audio/wav")
    await slack.send_event(slack.message("D1", "U1", "", files=[clip]))
    [answer] = await slack.wait_for_sent(1, timeout=10)
    assert answer["text"].startswith("echo: [voice message, transcribed]\nbook a room for friday")
    [request] = model.transcriptions
    assert request["file"]["data"] == wav(3) and request["model"] == "whisper-1"


async def test_a_failed_transcription_gets_one_line(world):
    slack, model, gw = world
    model.transcribe_fail = Fail(400, message="unsupported codec", type="invalid_request_error")
    clip = slack.add_file("F9", wav(2), name="clip.wav", mimetype="audio/wav")  # audio the endpoint refuses
    await slack.send_event(slack.message("D1", "U1", "", files=[clip]))
    [line] = await slack.wait_for_sent(1, timeout=10)
    assert line["text"].startswith("I could not transcribe your voice message (the transcription endpoint refused "
                                   "it (400)). It is saved;")
    assert model.requests == []


async def test_voice_on_uploads_the_spoken_reply_beside_its_text(world):
    slack, model, gw = world
    await slack.send_command("/voice", "on", user="U1", channel="D1")
    await slack.wait_for_calls("response_url", 1)
    await slack.send_event(slack.message("D1", "U1", "hello there"))
    await eventually(lambda: len(slack.uploads) == 1, 10)
    [text] = [m for m in slack.sent if (m.get("text") or "").startswith("echo: hello there")]
    [upload] = slack.uploads
    assert upload["channel"] == "D1" and upload["data"] == model.speech_audio and upload["filename"] == "reply.ogg"
    assert model.speeches[0]["input"] == "echo: hello there | turns: 1 | first: hello there"
    assert text["channel"] == "D1"
