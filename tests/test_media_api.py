"""The local API's media parts, through the real openai SDK: image_url, input_audio and file parts are
kept in the media folder, remembered on later turns, and bad parts get a clear 400."""

from __future__ import annotations

import base64
import sqlite3

import openai
import pytest

from tests.fakes import files
from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as m:
        yield m


def _client(gw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1", api_key="sk-anything",
                              max_retries=0, timeout=30)


def _images(request) -> list[str]:
    return [p["image_url"]["url"] for m in request.messages if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]


def _text(request) -> str:
    out = []
    for m in request.messages:
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    return "\n".join(x for x in out if x)


async def test_an_image_sent_to_the_api_is_seen_again_on_the_next_request(tmp_path, model):
    url = f"data:image/png;base64,{base64.b64encode(files.png()).decode()}"
    async with running_gateway(tmp_path, model, model={"vision": True}) as gw:
        client = _client(gw)
        key = {"X-Session-Key": "pics"}
        await client.chat.completions.create(model="m", extra_headers=key, messages=[{"role": "user", "content": [
            {"type": "text", "text": "remember this"}, {"type": "image_url", "image_url": {"url": url}}]}])
        await client.chat.completions.create(model="m", extra_headers=key,
                                             messages=[{"role": "user", "content": "what did I show you?"}])
        await client.close()
    assert _images(model.requests[0]) == _images(model.requests[1]) == [url]


async def test_input_audio_and_file_parts_are_kept_and_a_pdfs_text_reaches_the_model(tmp_path, model):
    voice = files.ogg_voice()
    pdf = files.pdf("The launch code is tangerine")
    async with running_gateway(tmp_path, model) as gw:
        client = _client(gw)
        await client.chat.completions.create(model="m", extra_headers={"X-Session-Key": "docs"}, messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "listen and read"},
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(voice).decode(), "format": "ogg"}},
                {"type": "file", "file": {"filename": "brief.pdf",
                                          "file_data": f"data:application/pdf;base64,{base64.b64encode(pdf).decode()}"}},
            ]}])
        await client.close()
        db_path = gw.config.db_path
    assert "[document brief.pdf:]\nThe launch code is tangerine\n[end of brief.pdf]" in _text(model.requests[-1])
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT kind, mime, size FROM message_media ORDER BY position").fetchall()
    assert rows == [("audio", "audio/ogg", len(voice)), ("document", "application/pdf", len(pdf))]


@pytest.mark.parametrize("part, error", [
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}},
     "messages[0].content[0].input_audio.format must be one of wav, mp3, ogg, flac, m4a, webm"),
    ({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}},
     "messages[0].content[0]: the audio's base64 data does not decode"),
    ({"type": "file", "file": {"file_id": "file-abc"}},
     "messages[0].content[0].file must hold 'file_data' (a data URL) and 'filename'; uploaded file ids are not "
     "kept by this gateway"),
])
async def test_a_bad_media_part_gets_a_clear_400(tmp_path, model, part, error):
    async with running_gateway(tmp_path, model) as gw:
        client = _client(gw)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": [part]}])
        await client.close()
    assert caught.value.body["message"] == error
    assert model.requests == []


@pytest.mark.parametrize("picture, line", [
    (files.truncated_png(), "is a damaged picture (cut off before its end), so the model cannot see it."),
    (files.cmyk_jpeg(), "(HTTP 400: invalid_image_format), so I answered without it; it will not be sent to the "
                        "model again."),
])
async def test_a_broken_or_refused_picture_over_the_api_is_left_out_and_said_once(tmp_path, model, picture, line):
    """A strict vision endpoint (it decodes what it is sent): a damaged picture never reaches it; one it
    refuses is left out on a second try and never sent again.  Either way the client gets its answer, and
    one X-Switchboard-Notice saying what happened to the picture."""
    model.images = "strict"
    mime = "image/jpeg" if picture.startswith(b"\xff\xd8") else "image/png"
    url = f"data:{mime};base64,{base64.b64encode(picture).decode()}"
    async with running_gateway(tmp_path, model, model={"vision": True}) as gw:
        client = _client(gw)
        key = {"X-Session-Key": "bad-pics"}
        first = await client.chat.completions.with_raw_response.create(
            model="m", extra_headers=key, messages=[{"role": "user", "content": [
                {"type": "text", "text": "look at this"}, {"type": "image_url", "image_url": {"url": url}}]}])
        second = await client.chat.completions.with_raw_response.create(
            model="m", extra_headers=key, messages=[{"role": "user", "content": "and now?"}])
        await client.close()
    [notice] = first.headers.get_list("X-Switchboard-Notice")
    assert notice.endswith(line) and notice.startswith(("image-", "The model could not read image-"))
    assert first.parse().choices[0].message.content.startswith("echo: look at this")
    assert second.headers.get_list("X-Switchboard-Notice") == []
    assert second.parse().choices[0].message.content.startswith("echo: and now?")
    sent = [u for r in model.requests for u in _images(r)]
    assert sent == ([url] if mime == "image/jpeg" else [])  # the refused one went once, the damaged one never
