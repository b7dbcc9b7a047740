"""A bad picture harms only itself: on (fake) Telegram, a truncated PNG, a JPEG with a damaged scan and a
50,000 x 50,000 PNG bomb each get one line and never reach the model; a valid picture after each, and the
next message, are answered as usual.  A picture that passes our decoding but that the model's endpoint
refuses (400 ``invalid_image_format``) is dropped for that turn, which is answered without it; the user
is told once, and it is never sent again (the chat is not wedged), with ``media.images_in_context: 0`` too.

The fake model is a vision endpoint either strict (it decodes every picture, as OpenAI's API and
llama.cpp's server do, and refuses what does not decode) or accepting anything (a broken picture would
reach it silently: the test checks that none does).
"""

from __future__ import annotations

import base64
import sqlite3
from functools import lru_cache

import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes import files
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config

ANN = FakeTelegram.user(111, "Ann")
VALID = files.png(rgb=(10, 200, 10))
VALID_URL = f"data:image/png;base64,{base64.b64encode(VALID).decode()}"


@lru_cache(maxsize=1)
def _bomb() -> bytes:
    return files.png_bomb()  # about 300 KB; built once (a second or two of zlib)


def _images(request) -> list[str]:
    return [part["image_url"]["url"] for m in request.messages if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image_url"]


@pytest.fixture
async def world(tmp_path):
    made: list = []

    async def start(images: str | None, **overrides):
        tg, model = FakeTelegram(), FakeModel()
        await tg.__aenter__()
        await model.__aenter__()
        model.images = images
        made.append((tg, model))
        config = gateway_config(tmp_path / "home", model.base_url, model={"vision": True},
                                auth={"allowed_users": ["telegram:111"]}, streaming={"enabled": False},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}}, **overrides)
        gw = Gateway(config, serve_api=False)
        await gw.start()
        made.append(gw)
        await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
        return tg, model, config

    yield start
    for thing in reversed(made):
        if isinstance(thing, Gateway):
            await thing.stop(grace_seconds=5)
        else:
            tg, model = thing
            await model.__aexit__(None, None, None)
            await tg.__aexit__(None, None, None)


BROKEN = [
    pytest.param("cut.png", files.truncated_png, "image/png",
                 "cut.png is a damaged picture (cut off before its end), so the model cannot see it.", id="truncated-png"),
    pytest.param("scan.jpg", files.corrupt_jpeg, "image/jpeg",
                 "scan.jpg is a damaged picture (its data does not decode), so the model cannot see it.",
                 id="corrupt-jpeg-scan"),
    pytest.param("bomb.png", _bomb, "image/png",
                 "bomb.png is a picture of more than 40,000,000 pixels, too large to read, so the model cannot "
                 "see it.", id="png-bomb"),
]


@pytest.mark.parametrize("endpoint", ["strict", None], ids=["strict-endpoint", "accepts-anything"])
@pytest.mark.parametrize("name, make, mime, line", BROKEN)
async def test_a_broken_picture_gets_one_line_and_the_chat_goes_on(world, endpoint, name, make, mime, line):
    tg, model, config = await world(endpoint)
    broken = make()
    tg.dm(ANN, None, caption="look at this", document=tg.document("bad", broken, name, mime))
    sent = await tg.wait_for_sent(2, timeout=15)
    assert [s.visible_text for s in sent][0] == line
    assert sent[1].visible_text.startswith("echo: look at this")

    tg.dm(ANN, None, caption="and this one", photo=tg.photo("good", VALID))
    sent = await tg.wait_for_sent(3, timeout=15)
    assert sent[2].visible_text.startswith("echo: and this one")
    assert _images(model.requests[-1]) == [VALID_URL]

    tg.dm(ANN, "what did you see?")
    sent = await tg.wait_for_sent(4, timeout=15)
    assert sent[3].visible_text.startswith("echo: what did you see?")
    assert [s.visible_text for s in sent].count(line) == 1  # told once
    broken_url = base64.b64encode(broken).decode()
    assert not any(broken_url in url for r in model.requests for url in _images(r))  # never reached the model
    assert _images(model.requests[-1]) == [VALID_URL]


@pytest.mark.parametrize("in_context", [4, 0])
async def test_a_picture_the_model_refuses_is_dropped_once_and_never_sent_again(world, in_context):
    tg, model, config = await world("strict", media={"images_in_context": in_context})
    cmyk = files.cmyk_jpeg()  # whole and valid: only the endpoint refuses it
    tg.dm(ANN, None, caption="print this", document=tg.document("cmyk", cmyk, "poster.jpg", "image/jpeg"))
    sent = await tg.wait_for_sent(2, timeout=15)
    assert [s.visible_text for s in sent] == [
        "The model could not read poster.jpg (HTTP 400: invalid_image_format), so I answered without it; it will "
        "not be sent to the model again.",
        sent[1].visible_text]
    assert sent[1].visible_text.startswith("echo: print this")
    refused, answered = model.requests[-2:]
    assert len(_images(refused)) == 1 and _images(answered) == []

    tg.dm(ANN, None, caption="and this one", photo=tg.photo("good", VALID))
    sent = await tg.wait_for_sent(3, timeout=15)
    assert sent[2].visible_text.startswith("echo: and this one")
    assert _images(model.requests[-1]) == [VALID_URL]
    tg.dm(ANN, "still there?")
    sent = await tg.wait_for_sent(4, timeout=15)
    assert sent[3].visible_text.startswith("echo: still there?")
    assert len(model.requests) == 4  # one refusal, then every call answered
    assert _images(model.requests[-1]) == ([VALID_URL] if in_context else [])
    with sqlite3.connect(config.db_path) as conn:  # persisted: a restart, or a re-sent message, skips it too
        [(note,)] = conn.execute("SELECT note FROM message_media WHERE name = 'poster.jpg'").fetchall()
    assert note == "was refused by the model (HTTP 400: invalid_image_format), so it is no longer shown to it"
