"""Voice in and out on Discord, end to end: fake Discord <-> real discord.py <-> our adapter <-> the real
gateway <-> the real ``openai`` SDK <-> the fake model server's chat and audio endpoints."""

from __future__ import annotations

import pytest

from adapters.discord import DiscordAdapter
from gateway.commands import default_commands
from gateway.config import Config
from gateway.runtime.daemon import Gateway
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.voicekit import ogg_opus, wav


@pytest.fixture
async def world(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test"},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}"]},
            "platforms": {
                "discord": {"token": dc.token, "api_base_url": dc.api_base_url, "gateway_url": dc.gateway_url,
                            "stall_timeout_seconds": 30},
                "telegram": {"enabled": False},
                "slack": {"enabled": False},
            },
            "media": {"transcribe_with": "whisper-1", "speak_with": "tts-1", "max_audio_seconds": 60},
            "streaming": {"enabled": False},
            "shutdown": {"grace_seconds": 2},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=default_commands().menu(),
                                             vision=config.model.vision)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            yield dc, model, gw
        finally:
            await gw.stop()


async def test_a_voice_message_and_an_audio_file_become_turns_on_their_transcripts(world):
    dc, model, gw = world
    model.transcript = "what is the weather like"
    await dc.dm(dc.alice, "", attachments=(dc.voice_message(ogg_opus(3), seconds=3.2),))
    [answer] = await dc.wait_for_sent(1, timeout=10)
    assert answer["content"].startswith("echo: [voice message, transcribed]\nwhat is the weather like")
    assert model.transcriptions[0]["file"]["data"] == ogg_opus(3)
    model.transcript = "and tomorrow"
    await dc.dm(dc.alice, "listen", attachments=(dc.attachment("memo.wav", wav(2), "audio/wav"),))
    sent = await dc.wait_for_sent(2, timeout=10)
    assert sent[1]["content"].startswith("echo: listen\n[voice message, transcribed]\nand tomorrow")
    assert [t["file"]["filename"] for t in model.transcriptions] == ["voice-message.ogg", "memo.wav"]


async def test_a_too_long_voice_message_is_refused_and_kept(world):
    dc, model, gw = world
    await dc.dm(dc.alice, "", attachments=(dc.voice_message(ogg_opus(2), seconds=75),))
    [line] = await dc.wait_for_sent(1, timeout=10)
    assert line["content"] == ("Your voice message is 1 min 15 s long; I transcribe up to 1 min. "
                               "Please send a shorter one, or type it.")
    assert model.transcriptions == [] and model.requests == []


async def test_voice_on_uploads_the_spoken_reply_after_its_text(world):
    dc, model, gw = world
    await dc.dm(dc.alice, "/voice on")
    await dc.wait_for_sent(1, timeout=10)
    await dc.dm(dc.alice, "say hi")
    await dc.wait_until(lambda: len(dc.uploads) == 1, 10, "the voice upload")
    sent = dc.sent()
    assert sent[1]["content"] == "echo: say hi | turns: 1 | first: say hi"
    assert sent[2]["content"] == "" and sent[2]["attachments"][0]["filename"] == "reply.ogg"
    [upload] = dc.uploads
    assert upload["data"] == model.speech_audio and upload["channel_id"] == dc.alice["dm_channel_id"]
    await dc.dm(dc.alice, "/voice off")
    await dc.dm(dc.alice, "quiet now")
    await dc.wait_until(lambda: any(m["content"].startswith("echo: quiet now") for m in dc.sent()), 10, "the answer")
    assert len(dc.uploads) == 1
