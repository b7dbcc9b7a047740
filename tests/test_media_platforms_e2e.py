"""End to end on fake Discord and fake Slack: a picture and a document sent in a DM reach the model, the
picture again on the next turn (the Telegram path is tests/test_media_e2e.py)."""

from __future__ import annotations

import base64

import pytest

from adapters.discord import DiscordAdapter
from gateway.commands import default_commands
from gateway.config import Config
from gateway.runtime.daemon import Gateway
from tests.fakes import files
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.harness import eventually, gateway_config


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def _images(request) -> list[str]:
    return [p["image_url"]["url"] for m in request.messages if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]


def _text(request) -> str:
    out = []
    for m in request.messages:
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    return "\n".join(x for x in out if x)


PICTURE = files.png(rgb=(0, 0, 255))
URL = f"data:image/png;base64,{base64.b64encode(PICTURE).decode()}"
PDF = files.pdf("Tickets go on sale on Friday")


async def test_discord_a_picture_and_a_pdf_are_remembered(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test", "vision": True},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}"]},
            "platforms": {"discord": {"token": dc.token, "api_base_url": dc.api_base_url,
                                      "gateway_url": dc.gateway_url, "stall_timeout_seconds": 30},
                          "telegram": {"enabled": False}, "slack": {"enabled": False}},
            "shutdown": {"grace_seconds": 2},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=default_commands().menu(),
                                             vision=True, media=None)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            await dc.dm(dc.alice, "look", attachments=(dc.attachment("blue.png", PICTURE, "image/png"),
                                                       dc.attachment("sale.pdf", PDF, "application/pdf")))
            await dc.wait_for_sent(1, timeout=10)
            await dc.dm(dc.alice, "when do tickets go on sale, and what colour was it?")
            await dc.wait_for_sent(2, timeout=10)
        finally:
            await gw.stop()
    for request in model.requests[-2:]:
        assert _images(request) == [URL]
        assert "[document sale.pdf:]\nTickets go on sale on Friday" in _text(request)


async def test_slack_a_picture_and_a_pdf_are_remembered(tmp_path):
    async with FakeSlack() as slack, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url, model={"vision": True},
            auth={"allowed_users": ["slack:U1"]},
            platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                 "api_base_url": slack.base_url}},
        )
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()
            shared = [slack.add_file("F1", PICTURE, name="blue.png", mimetype="image/png"),
                      slack.add_file("F2", PDF, name="sale.pdf", mimetype="application/pdf")]
            await slack.send_event(slack.message("D1", "U1", "look", files=shared))
            await slack.wait_for_sent(1, timeout=10)
            await slack.send_event(slack.message("D1", "U1", "when do tickets go on sale?"))
            await slack.wait_for_sent(2, timeout=10)
        finally:
            await gw.stop(grace_seconds=5)
    for request in model.requests[-2:]:
        assert _images(request) == [URL]
        assert "[document sale.pdf:]\nTickets go on sale on Friday" in _text(request)
