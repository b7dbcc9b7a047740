"""Feishu / Lark beyond the conformance kit, against tests/fakes/lark.py (the open API's token rules,
the long connection's frames as lark-oapi speaks them, and the HTTP callbacks encrypted and signed as
the platform does, to /lark/events served as the local API serves it)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.lark import LarkAdapter, LarkConfig
from adapters.lark.config import EVENTS_PATH
from adapters.teams import TeamsConfig
from gateway.runtime.cluster import connection_key
from gateway.types import Button, ChatRef, ChatType, InboundMessage
from tests.adapter_config import configured
from tests.fakes.lark import FakeLark
from tests.platform_paths import serving
from tests.waiting import eventually


@pytest.fixture
async def lark():
    async with FakeLark() as fake:
        yield fake


class Inbox:
    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.fail = 0

    async def __call__(self, msg: InboundMessage) -> bool:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the store is down")
        self.messages.append(msg)
        return True


async def _started(lark: FakeLark, inbox: Inbox, **overrides) -> LarkAdapter:
    settings = dict(app_id=lark.app_id, app_secret=lark.app_secret, base_url=lark.base_url)
    settings.update(overrides)
    adapter = configured(LarkAdapter, LarkConfig, **settings)
    await adapter.start(inbox)
    return adapter


async def _acked(lark: FakeLark, event: dict, *, parts: int = 1) -> str:
    frame = await lark.send_event(event, parts=parts)
    await eventually(lambda: lark.acknowledged(frame), 10, f"frame {frame} acknowledged")
    return frame


async def test_chats_are_keyed_mentions_stripped_and_a_split_event_put_back_together(lark):
    inbox = Inbox()
    adapter = await _started(lark, inbox)
    try:
        await _acked(lark, lark.message("oc_dm", "ou_ann", "in private"))
        await _acked(lark, lark.message("oc_g", "ou_ann", "hello bot", chat_type="group", mention=True))
        await _acked(lark, lark.message("oc_g", "ou_bob", "just chatting", chat_type="group"))
        await _acked(lark, lark.message("oc_g", "ou_bob", "in the topic " + "long " * 400, chat_type="group",
                                        mention=True, root_id="om_root9"), parts=3)
    finally:
        await adapter.stop()
    got = [(m.chat_type, m.chat_id, m.thread_id, m.text[:20], m.addressed) for m in inbox.messages]
    assert got == [(ChatType.DM, "oc_dm", None, "in private", True),
                   (ChatType.GROUP, "oc_g", None, "hello bot", True),
                   (ChatType.GROUP, "oc_g", None, "just chatting", False),
                   (ChatType.THREAD, "oc_g", "om_root9", "in the topic long lo", True)]


async def test_an_event_the_gateway_could_not_store_comes_again_and_is_stored_once(lark):
    inbox = Inbox()
    adapter = await _started(lark, inbox)
    try:
        inbox.fail = 1
        event = lark.message("oc_dm", "ou_ann", "keep me")
        frame = await lark.send_event(event)
        await eventually(lambda: lark.pushed.count(frame) == 1 and not inbox.fail, 10, "the failed attempt")
        assert not lark.acknowledged(frame)
        await lark.drop_connection()  # the platform pushes what was not acknowledged on the next connection
        await eventually(lambda: lark.acknowledged(frame), 20, "the event acknowledged after the reconnect")
        await _acked(lark, event)  # and a plain duplicate, acknowledged without a second hand-over
    finally:
        await adapter.stop()
    assert [m.text for m in inbox.messages] == ["keep me"]


async def test_the_tenant_token_is_refreshed_before_it_expires(lark):
    lark.token_lifetime = 1801  # the adapter refreshes 30 minutes before the end: 1 s from now
    inbox = Inbox()
    adapter = await _started(lark, inbox)
    try:
        assert (await adapter.send(ChatRef("lark", "oc_dm"), "one")).ok
        await asyncio.sleep(1.1)
        assert (await adapter.send(ChatRef("lark", "oc_dm"), "two")).ok
    finally:
        await adapter.stop()
    assert [s.text for s in lark.shown("oc_dm")] == ["one", "two"]
    assert lark.tokens_issued() == 2


async def test_a_rejected_app_secret_stops_trying_and_says_what_to_fix(lark):
    adapter = LarkAdapter(LarkConfig(app_id=lark.app_id, app_secret="an-old-secret", base_url=lark.base_url))
    await adapter.start(Inbox())
    try:
        state, error = adapter.health().state, adapter.health().last_error
        delivery = await adapter.send(ChatRef("lark", "oc_dm"), "hello")
    finally:
        await adapter.stop()
    assert state == "failed" and "code 10014" in error and "platforms.lark.app_secret" in error
    assert "an-old-secret" not in error
    assert not delivery.ok and delivery.retry_later and delivery.error == error
    assert lark.tokens_issued() == 1 and not [c for c in lark.calls if c.method == "endpoint"]


async def test_a_rate_limit_code_is_waited_out(lark):
    adapter = await _started(lark, Inbox())
    try:
        lark.fail_next(1, status=429, retry_after=1.0)
        delivery = await adapter.send(ChatRef("lark", "oc_dm"), "patiently")
    finally:
        await adapter.stop()
    times = lark.times("oc_dm")
    assert delivery.ok and [s.text for s in lark.shown("oc_dm")] == ["patiently"]
    assert len(times) == 2 and times[1] - times[0] >= 0.95


async def test_a_voice_message_and_an_image_are_downloaded_into_the_message(lark):
    inbox = Inbox()
    adapter = await _started(lark, inbox)
    try:
        lark.add_file("file_voice", b"OggS fake opus")
        lark.add_file("img_1", b"\x89PNG fake")
        await _acked(lark, lark.message("oc_dm", "ou_ann", "", message_type="audio",
                                        content={"file_key": "file_voice", "duration": 2000}))
        await _acked(lark, lark.message("oc_dm", "ou_ann", "", message_type="image", content={"image_key": "img_1"}))
    finally:
        await adapter.stop()
    got = [(a.kind, a.data, a.duration) for m in inbox.messages for a in m.attachments]
    assert got == [("audio", b"OggS fake opus", 2.0), ("image", b"\x89PNG fake", None)]


def test_the_long_connection_belongs_to_one_instance_and_teams_to_every_one():
    lark = LarkConfig(app_id="cli_abc", app_secret="s")
    key = connection_key("lark", lark)
    assert key is not None and key.startswith("lark:") and "cli_abc" not in key  # named by a hash of the app id
    assert key != connection_key("lark", LarkConfig(app_id="cli_other", app_secret="s"))
    assert connection_key("teams", TeamsConfig(app_id="x", app_password="y")) is None


# --------------------------------------------------------------------------- mode: http (event callbacks)


_HTTP: dict[int, LarkAdapter] = {}  # id(fake) -> the adapter /lark/events reaches


@pytest.fixture
async def lark_http():
    """The fake, pushing callbacks to /lark/events as the local API serves it (tests/platform_paths.py)."""
    async with FakeLark() as fake:
        async with serving("lark", lambda: _HTTP.get(id(fake))) as base:
            fake.callback_url = base + EVENTS_PATH
            try:
                yield fake
            finally:
                _HTTP.pop(id(fake), None)


async def _on_http(lark: FakeLark, inbox: Inbox, **overrides) -> LarkAdapter:
    adapter = await _started(lark, inbox, mode="http", verification_token=lark.verification_token,
                             encrypt_key=lark.encrypt_key, **overrides)
    _HTTP[id(lark)] = adapter
    return adapter


async def test_callbacks_answer_the_url_check_and_hand_over_each_event_once(lark_http):
    lark, inbox = lark_http, Inbox()
    adapter = await _on_http(lark, inbox)
    try:
        assert adapter.health().state == "connected" and EVENTS_PATH in adapter.health().detail
        assert lark.connections == 0  # no long connection in this mode
        assert await lark.verify_url("ch-4711") == (200, {"challenge": "ch-4711"})
        assert (await lark.verify_url("ch-4712", token="another-apps-token"))[0] == 401
        event = lark.message("oc_dm", "ou_ann", "by callback")
        assert await lark.callback(event) == 200
        assert await lark.callback(event) == 200  # the platform pushed it again: answered, not handed over
        group = lark.message("oc_g", "ou_bob", "hello bot", chat_type="group", mention=True)
        assert await lark.callback(group) == 200
        [card_id] = [await adapter.send_buttons(ChatRef("lark", "oc_dm"), "Run it?",
                                                (Button("Approve", "/approve 1f2e3d4c"),))]
        assert card_id.ok
        assert await lark.callback(lark.press_event(card_id.message_ids[0], "ou_ann", "/approve 1f2e3d4c")) == 200
    finally:
        await adapter.stop()
    assert [(m.chat_id, m.user_id, m.text, m.addressed) for m in inbox.messages] == [
        ("oc_dm", "ou_ann", "by callback", True), ("oc_g", "ou_bob", "hello bot", True),
        ("oc_dm", "ou_ann", "/approve 1f2e3d4c", True)]
    assert lark.unacknowledged() == []  # nothing came on a long connection


async def test_a_callback_not_encrypted_signed_or_tokened_as_the_platform_does_reaches_nothing(lark_http):
    lark, inbox = lark_http, Inbox()
    adapter = await _on_http(lark, inbox)
    event = lark.message("oc_dm", "ou_eve", "forged")
    plain = lark.callback_body(event, encrypted=False)
    good = lark.callback_body(event)
    other_token = lark.callback_body({**event, "header": {**event["header"], "token": "guessed"}})
    wrong_key = lark.callback_body(event, key="not-the-encrypt-key")
    try:
        statuses = {
            "plain JSON, signed": (await lark.post_callback(plain, lark.signed_headers(plain)))[0],
            "encrypted with another key": (await lark.post_callback(wrong_key, lark.signed_headers(wrong_key)))[0],
            "not signed": (await lark.post_callback(good, {"Content-Type": "application/json"}))[0],
            "signed with another key": (await lark.post_callback(good, lark.signed_headers(good, key="k2")))[0],
            "signed over another body": (await lark.post_callback(good, lark.signed_headers(plain)))[0],
            "another Verification Token": (await lark.post_callback(other_token,
                                                                    lark.signed_headers(other_token)))[0],
        }
        garbage = (await lark.post_callback(b"\xff not json", {"Content-Type": "application/json"}))[0]
    finally:
        await adapter.stop()
    assert statuses == dict.fromkeys(statuses, 401)
    assert garbage == 400
    assert inbox.messages == [] and adapter.refused == len(statuses) + 1


async def test_a_callback_the_gateway_failed_on_is_pushed_again_and_handed_over_once(lark_http):
    lark, inbox = lark_http, Inbox()
    inbox.fail = 1
    adapter = await _on_http(lark, inbox)
    try:
        assert await lark.callback(lark.message("oc_dm", "ou_ann", "store me")) == 500
        await eventually(lambda: len(inbox.messages) == 1, 10, "the callback pushed again and taken")
        await eventually(lambda: lark.callbacks[-1][1] == 200, 10, "the push answered 200")
    finally:
        await adapter.stop()
    assert [m.text for m in inbox.messages] == ["store me"]
    assert [status for _, status in lark.callbacks] == [500, 200]


async def test_the_callback_path_answers_only_in_http_mode(lark_http):
    lark, inbox = lark_http, Inbox()
    adapter = await _started(lark, inbox)  # the long connection
    _HTTP[id(lark)] = adapter
    try:
        status, answer = await lark.verify_url("ch-1")
    finally:
        await adapter.stop()
    assert status == 404 and "websocket" in answer["error"]


def test_http_mode_needs_the_verification_token_and_the_encrypt_key():
    with pytest.raises(ValueError, match="LARK_VERIFICATION_TOKEN"):
        LarkConfig(app_id="cli_abc", app_secret="s", mode="http", encrypt_key="k")
    with pytest.raises(ValueError, match="LARK_ENCRYPT_KEY.*neither encrypts nor signs"):
        LarkConfig(app_id="cli_abc", app_secret="s", mode="http", verification_token="t")
    on_http = LarkConfig(app_id="cli_abc", app_secret="s", mode="http", verification_token="t", encrypt_key="k")
    assert connection_key("lark", on_http) is None  # callbacks reach any instance of a cluster
