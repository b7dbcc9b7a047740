"""WhatsApp beyond the conformance kit: the webhook's handshake and signatures, the 24-hour window,
Meta's error codes, statuses, media and reactions, each against tests/fakes/whatsapp.py (the kit,
tests/test_platform_kit.py, runs the whole gateway against it too).

    .venv/bin/python -m pytest -q -n 0 tests/test_whatsapp.py
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from adapters.whatsapp import WhatsAppAdapter, WhatsAppConfig
from gateway.runtime.platform_http import PlatformHttp
from gateway.types import Button, ChatRef, InboundMessage
from tests.adapter_config import configured
from tests.fakes.whatsapp import FakeWhatsApp, sign

ANN = "4915100000001"


@asynccontextmanager
async def serving(adapter: WhatsAppAdapter):
    """The daemon's own mounting of the platforms' paths (gateway.runtime.platform_http) on a server at
    port 0, handing /whatsapp/webhook to ``adapter``; yields the webhook's URL."""
    app = web.Application()
    PlatformHttp.installed(lambda name: adapter if name == "whatsapp" else None).mount(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/whatsapp/webhook"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def running(wa: FakeWhatsApp, **kw):
    got: list[InboundMessage] = []

    async def handler(message: InboundMessage) -> None:
        got.append(message)

    adapter = configured(WhatsAppAdapter, WhatsAppConfig, access_token=wa.token, phone_number_id=wa.phone_number_id,
                         app_secret=wa.app_secret, verify_token=wa.verify_token, api_base_url=wa.base_url, **kw)
    async with serving(adapter) as url:
        await adapter.start(handler)
        wa.webhook_url = url
        try:
            yield adapter, got
        finally:
            await adapter.stop()


async def test_the_verification_handshake_answers_the_challenge_only_to_our_verify_token():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, _), aiohttp.ClientSession() as http:
        assert wa.webhook_url
        url = wa.webhook_url
        ok = {"hub.mode": "subscribe", "hub.verify_token": wa.verify_token, "hub.challenge": "1158201444"}
        async with http.get(url, params=ok) as r:
            assert (r.status, await r.text()) == (200, "1158201444")
        async with http.get(url, params=dict(ok, **{"hub.verify_token": "guess"})) as r:
            assert r.status == 403 and "1158201444" not in await r.text()


async def test_an_unsigned_or_forged_post_is_refused_and_reaches_nothing():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, got):
        body = json.dumps(wa.message(ANN, "text", {"body": "forged"})).encode()
        assert await wa.post(body, {}) == 401
        assert await wa.post(body, {"X-Hub-Signature-256": sign("not-the-app-secret", body)}) == 401
        assert await wa.post(body + b" ", {"X-Hub-Signature-256": sign(wa.app_secret, body)}) == 401  # altered
        assert await wa.post(body, {"X-Hub-Signature-256": sign(wa.app_secret, body)}) == 200
        assert [m.text for m in got] == ["forged"]  # only the signed one
        assert adapter.refused_webhooks == 3


async def test_a_retried_webhook_is_handed_over_once():
    async with FakeWhatsApp() as wa, running(wa) as (_, got):
        payload = wa.text(ANN, "once", name="Ann")
        wa.push(payload)
        wa.text(ANN, "marker")
        await wa.drained()
    assert [(m.text, m.chat_id, m.user_name) for m in got] == [("once", ANN, "Ann"), ("marker", ANN, ANN)]  # the profile name Meta sends


async def test_outside_the_24_hour_window_the_template_goes_or_the_reply_fails_saying_why():
    async with FakeWhatsApp() as wa:
        async with running(wa) as (adapter, _):
            failed = await adapter.send(ChatRef("whatsapp", ANN), "your report is ready")
        async with running(wa, template_name="reply_later") as (adapter, _):
            sent = await adapter.send(ChatRef("whatsapp", ANN), "your report is ready")
    assert not failed.ok and "24-hour" in failed.error and "template_name" in failed.error
    assert sent.ok and wa.texts_to(ANN) == ["[template reply_later] your report is ready"]


async def test_a_refused_token_fails_the_send_at_once_and_stops_retrying():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, _):
        wa.text(ANN, "hello")
        await wa.drained()
        wa.token = "rotated"  # the one the adapter holds is refused from now on
        first = await adapter.send(ChatRef("whatsapp", ANN), "answer")
        calls = len(wa.calls)
        second = await adapter.send(ChatRef("whatsapp", ANN), "another")
        assert len(wa.calls) == calls  # nothing more asked of Meta
        health = adapter.health().as_dict()
    assert not first.ok and "refused the access token" in first.error and "190" in first.error
    assert second.error == first.error
    assert health["state"] == "failed" and "access_token" in (health["last_error"] or "")


async def test_the_pair_rate_and_a_refused_message_each_get_what_meta_says():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, _):
        wa.text(ANN, "hello")
        await wa.drained()
        wa.pair_burst, wa.pair_interval = 1, 1.0
        chat = ChatRef("whatsapp", ANN)
        started = time.monotonic()
        assert (await adapter.send(chat, "one")).ok
        assert (await adapter.send(chat, "two")).ok  # 131056 first, then after the backoff
        waited = time.monotonic() - started
        refused = await adapter.send(ChatRef("whatsapp", "not-a-number"), "x")
    assert wa.texts_to(ANN) == ["one", "two"] and waited >= 0.9
    assert [c.status for c in wa.calls if c.body.get("to") == ANN and c.body.get("type") == "text"] == [200, 400, 200]
    assert not refused.ok and "131009" in refused.error


async def test_statuses_are_kept_per_message_and_a_failure_says_its_code():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, _):
        wa.text(ANN, "hello")
        await wa.drained()
        sent = await adapter.send(ChatRef("whatsapp", ANN), "hi")
        [wamid] = sent.message_ids
        for status in ("sent", "delivered", "read"):
            wa.status(wamid, status, ANN)
        wa.status("wamid.OTHER", "failed", ANN, code=131026)
        await wa.drained()
        statuses = {k: (s.status, s.error_code) for k, s in adapter.statuses.items()}
        health = adapter.health().as_dict()
    assert statuses == {wamid: ("read", None), "wamid.OTHER": ("failed", 131026)}
    assert "131026" in (health["last_error"] or "")


async def test_a_voice_note_and_a_picture_are_downloaded_through_the_media_endpoint():
    async with FakeWhatsApp() as wa, running(wa) as (_, got):
        voice = wa.add_media(b"OggS-voice-bytes", "audio/ogg; codecs=opus")
        photo = wa.add_media(b"\xff\xd8\xff-jpeg", "image/jpeg")
        wa.push(wa.message(ANN, "audio", {"id": voice, "mime_type": "audio/ogg; codecs=opus", "voice": True}))
        wa.push(wa.message(ANN, "image", {"id": photo, "mime_type": "image/jpeg", "caption": "look"}))
        await wa.drained()
    [(a,), (b,)] = [m.attachments for m in got]
    assert (a.kind, a.name, a.data) == ("audio", "voice.ogg", b"OggS-voice-bytes")
    assert (b.kind, b.data, got[1].text) == ("image", b"\xff\xd8\xff-jpeg", "look")


async def test_buttons_a_thumbs_up_on_them_and_the_typing_receipt():
    async with FakeWhatsApp() as wa, running(wa) as (adapter, got):
        wa.text(ANN, "ship it")
        await wa.drained()
        chat = ChatRef("whatsapp", ANN)
        sent = await adapter.send_buttons(chat, "Run ledger__append?", (Button("Approve", "/approve 3f9a"),
                                                                        Button("Deny", "/deny 3f9a", "danger")))
        await adapter.send_typing(chat)
        wa.push(wa.message(ANN, "reaction", {"message_id": sent.message_ids[0], "emoji": "👍"}))
        wa.push(wa.message(ANN, "reaction", {"message_id": "wamid.SOMETHING", "emoji": "👍"}))  # not a request
        await wa.drained()
        four = await adapter.send_buttons(chat, "pick", tuple(Button(str(i), f"/approve {i}") for i in range(4)))
    assert [m.text for m in got] == ["ship it", "/approve 3f9a"]
    assert wa.button_ids(wa.to(ANN)[0]) == ["/approve 3f9a", "/deny 3f9a"]
    assert [r["message_id"] for r in wa.reads] == [got[0].message_id] and wa.reads[0]["typing_indicator"]
    assert four.ok and wa.texts_to(ANN)[-1] == "pick\n\n0: /approve 0\n1: /approve 1\n2: /approve 2\n3: /approve 3"


async def test_doctor_asks_the_graph_api_with_the_token_and_never_prints_it(tmp_path):
    from tests.fakes.model_server import FakeModel
    from tests.test_doctor import doctor, line, write_config

    async with FakeModel(model_name="fake-model") as model, FakeWhatsApp() as wa:
        settings = {"access_token": wa.token, "phone_number_id": wa.phone_number_id, "app_secret": wa.app_secret,
                    "verify_token": wa.verify_token, "api_base_url": wa.base_url}
        good = write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"},
                            platforms={"whatsapp": settings})
        _, ok = await doctor(good)
        wa.token = "rotated"
        _, refused = await doctor(good)
    assert line(ok, "whatsapp") == "✓ whatsapp: token valid (+1 555-0100)", ok
    assert line(refused, "whatsapp").startswith("✗ whatsapp: the token was refused (HTTP 401)"), refused
    assert settings["access_token"] not in ok + refused


def test_markdown_becomes_whatsapps_own_marks():
    from adapters.whatsapp.format import to_whatsapp

    assert to_whatsapp("**Bold**, *italic*, ~~gone~~ and `code`") == "*Bold*, _italic_, ~gone~ and `code`"
    assert to_whatsapp("# Title\n\nsee [the docs](https://example.org/docs)") == \
        "*Title*\n\nsee the docs (https://example.org/docs)"
    assert to_whatsapp("> quoted\n\n- one\n- two") == "> quoted\n\n• one\n• two"


async def test_a_token_refused_at_start_is_not_retried_and_names_the_key():
    from gateway.errors import TokenRejected

    async with FakeWhatsApp() as wa:
        adapter = WhatsAppAdapter(WhatsAppConfig(access_token="EAAG-revoked", phone_number_id=wa.phone_number_id,
                                                 app_secret=wa.app_secret, verify_token=wa.verify_token,
                                                 api_base_url=wa.base_url))
        async with serving(adapter) as url:
            with pytest.raises(TokenRejected) as info:
                await adapter.start(lambda m: None)  # type: ignore[arg-type]
            wa.webhook_url = url
            body = json.dumps(wa.message(ANN, "text", {"body": "hello"})).encode()
            # nothing is taken for a number it cannot answer from: Meta is told to deliver it again later
            assert await wa.post(body, {"X-Hub-Signature-256": sign(wa.app_secret, body)}) == 503
    assert info.value.key == "platforms.whatsapp.access_token" and "EAAG-revoked" not in str(info.value)
