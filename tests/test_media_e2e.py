"""End to end: pictures and documents sent on (fake) Telegram are kept in the media folder, remembered
by later turns, read for the model, and deleted with their session.

fake Telegram <-> python-telegram-bot <-> our adapter <-> the gateway <-> the fake model, which records
every request: what the model was sent is asserted there, what the user saw on the fake Telegram.
"""

from __future__ import annotations

import base64
import sqlite3
import stat

import pytest
from click.testing import CliRunner

from gateway.cli.sessions import sessions
from gateway.runtime.daemon import Gateway
from tests.fakes import files
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config

ANN = FakeTelegram.user(111, "Ann")


def _images(request) -> list[str]:
    """The image URLs of every message of a recorded model request."""
    return [part["image_url"]["url"] for m in request.messages if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image_url"]


def _text(request) -> str:
    out = []
    for m in request.messages:
        content = m.get("content")
        out += [content] if isinstance(content, str) else [p.get("text", "") for p in content or [] if isinstance(p, dict)]
    return "\n".join(c for c in out if c)


def _media_files(home) -> list:
    root = home / "media"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
async def world(tmp_path):
    async def start(**overrides):
        """A gateway on fake Telegram and a fake model; an override may be a function of the model's URL."""
        tg, model = FakeTelegram(), FakeModel()
        await tg.__aenter__()
        await model.__aenter__()
        started.append((tg, model))
        config = gateway_config(
            tmp_path / "home", model.base_url,
            auth={"allowed_users": ["telegram:111"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
            **{k: v(model.base_url) if callable(v) else v for k, v in overrides.items()},
        )
        gw = Gateway(config, serve_api=False)
        await gw.start()
        gateways.append(gw)
        await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
        return tg, model, gw, config

    started: list = []
    gateways: list[Gateway] = []
    yield start
    for gw in gateways:
        await gw.stop(grace_seconds=5)
    for tg, model in started:
        await model.__aexit__(None, None, None)
        await tg.__aexit__(None, None, None)


async def test_a_picture_comes_back_to_a_vision_model_on_later_turns(world):
    tg, model, gw, config = await world(model={"vision": True})
    picture = files.png(rgb=(10, 200, 10))
    tg.dm(ANN, None, caption="this is my cat", photo=tg.photo("cat", picture))
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "what colour was the picture I sent?")
    await tg.wait_for_sent(2, timeout=10)
    tg.dm(ANN, "and now?")
    await tg.wait_for_sent(3, timeout=10)
    first, second, third = model.requests[-3:]
    url = f"data:image/png;base64,{base64.b64encode(picture).decode()}"
    assert _images(first) == _images(second) == _images(third) == [url]
    # the file is kept once, outside the database, readable by the gateway's user only
    [kept] = _media_files(config.home)
    assert kept.read_bytes() == picture
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    with sqlite3.connect(config.db_path) as conn:
        assert conn.execute("SELECT name, mime, size, kind FROM message_media").fetchall() == [
            ("photo.jpg", "image/png", len(picture), "image")]
        assert not conn.execute("SELECT 1 FROM messages WHERE content LIKE '%base64%'").fetchall()


async def test_only_the_last_images_in_context_are_sent_again(world):
    tg, model, gw, config = await world(model={"vision": True}, media={"images_in_context": 2})
    for i in range(3):
        tg.dm(ANN, None, caption=f"picture {i}", photo=tg.photo(f"p{i}", files.png(rgb=(i, i, i))))
        await tg.wait_for_sent(i + 1, timeout=10)
    tg.dm(ANN, "which pictures do you see?")
    await tg.wait_for_sent(4, timeout=10)
    urls = _images(model.requests[-1])
    assert urls == [f"data:image/png;base64,{base64.b64encode(files.png(rgb=(i, i, i))).decode()}" for i in (1, 2)]


async def test_a_pdfs_text_reaches_the_model_and_stays_on_later_turns(world):
    tg, model, gw, config = await world()
    pdf = files.pdf("Quarterly revenue was 42 zeppelins")
    tg.dm(ANN, None, caption="summarise this", document=tg.document("q3", pdf, "q3.pdf", "application/pdf"))
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "how many zeppelins?")
    await tg.wait_for_sent(2, timeout=10)
    for request in model.requests[-2:]:
        assert "[document q3.pdf:]\nQuarterly revenue was 42 zeppelins\n[end of q3.pdf]" in _text(request)
    with sqlite3.connect(config.db_path) as conn:  # the text is stored once, with the file's reference
        assert conn.execute("SELECT name, kind, text FROM message_media").fetchall() == [
            ("q3.pdf", "document", "Quarterly revenue was 42 zeppelins")]
        stored = conn.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id").fetchall()
    assert stored == [("summarise this\n[attached document: q3.pdf]",), ("how many zeppelins?",)]


@pytest.mark.parametrize("name, data, mime, line", [
    ("report.pdf", files.zip_bomb(), "application/pdf", "report.pdf says it is a PDF but is a ZIP archive; "
                                                        "it was not opened."),
    ("broken.pdf", files.broken_pdf(), "application/pdf", "broken.pdf is a PDF that does not parse; it was not read."),
    ("cat.png", b"<html>not a picture</html>", "image/png", "cat.png is not a picture (its bytes are not JPEG, PNG, "
                                                             "GIF or WebP), so the model cannot see it."),
])
async def test_a_file_that_cannot_be_read_gets_one_clear_line_and_the_turn_goes_on(world, name, data, mime, line):
    tg, model, gw, config = await world(model={"vision": True})
    tg.dm(ANN, None, caption="look", document=tg.document("bad", data, name, mime))
    sent = await tg.wait_for_sent(2, timeout=10)
    assert [s.visible_text for s in sent][0] == line
    assert sent[1].visible_text.startswith("echo: look")
    assert _images(model.requests[-1]) == []


async def test_a_model_without_vision_gets_a_description_made_once(world):
    # the describing model is the same fake server, told apart by the model name it is asked for
    tg, model, gw, config = await world(
        models=lambda url: {"eyes": {"base_url": url, "name": "eyes-model", "vision": True}},
        media={"describe_with": "eyes"})
    tg.dm(ANN, None, caption="my cat", photo=tg.photo("cat", files.png()))
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "what did I send?")
    await tg.wait_for_sent(2, timeout=10)
    asked = [r for r in model.requests if r.body.get("model") == "eyes-model"]
    turns = [r for r in model.requests if r.body.get("model") == "fake-model"]
    assert len(asked) == 1 and len(_images(asked[0])) == 1  # described once, shown the picture
    assert len(turns) == 2 and all(_images(t) == [] for t in turns)  # the chat's model never gets the picture
    # the fake answers with an echo of what it was asked: that echo is the description
    assert all("[image photo.jpg: echo: Describe this picture" in _text(t) for t in turns)
    with sqlite3.connect(config.db_path) as conn:
        [(text,)] = conn.execute("SELECT text FROM message_media").fetchall()
    assert text.startswith("echo: Describe this picture")


async def test_media_are_deleted_with_their_session_and_nothing_is_left_orphaned(world):
    tg, model, gw, config = await world(model={"vision": True})
    tg.dm(ANN, None, caption="keep this", photo=tg.photo("cat", files.png()))
    tg.dm(ANN, None, caption="and this", document=tg.document("d", b"notes: buy milk", "notes.txt", "text/plain"))
    await tg.wait_for_sent(2, timeout=10)
    assert len(_media_files(config.home)) == 2
    await gw.stop(grace_seconds=5)
    with sqlite3.connect(config.db_path) as conn:
        [(session_id,)] = conn.execute("SELECT id FROM sessions").fetchall()
    result = CliRunner().invoke(sessions, ["delete", session_id, "--yes", "--home", str(config.home)])
    assert result.exit_code == 0, result.output
    assert "deleted 2 media files" in result.output
    assert _media_files(config.home) == []
    with sqlite3.connect(config.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM message_media").fetchone() == (0,)
