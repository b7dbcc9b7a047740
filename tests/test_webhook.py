"""Webhooks (``platforms.webhook``) end to end: the real gateway serves ``POST /webhooks/<name>`` on its
local API; tests/fakes/webhook.py signs the requests and receives the callbacks, checking their
signatures.  The kit (tests/test_platform_kit.py) runs the shared checks; these are the webhook's own:
signatures both ways (a resend after a crash between claim and store is taken), field paths, waiting
for the answer, allowed senders per hook, retries and dead letters of the callback, a cron job
delivering to a hook, and the config's errors."""

from __future__ import annotations

import json
import re
import time

import aiohttp
import pytest

from adapters.webhook.signing import MemoryLedger
from gateway.config import config_from_dict
from gateway.errors import ConfigError
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel, Reply
from tests.fakes.webhook import FakeHookSide
from tests.harness import eventually, gateway_config, stored_routes


@pytest.fixture
async def side():
    async with FakeHookSide() as fake:
        yield fake


async def running(tmp_path, model, side, hooks: dict, **overrides):
    config = gateway_config(tmp_path / "home", model.base_url, platforms={"webhook": {"hooks": hooks}}, **overrides)
    gw = Gateway(config, serve_api=True)
    await gw.start()
    side.gateway_url = f"http://127.0.0.1:{gw.api.bound_port}"
    await eventually(lambda: gw.health()["platforms"]["webhook"]["state"] == "connected", 10, "webhook connected")
    return gw


def hook(side, **extra) -> dict:
    return {"secret": side.secret, "callback_url": side.callback_url, **extra}


async def test_signatures_are_checked_and_stale_replayed_or_forged_requests_refused(tmp_path, side):
    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"ci": hook(side, allowed_senders=["builder"])},
                           api={"token": "sk-api-token-for-the-other-endpoints"})
        try:
            body = json.dumps({"sender": "builder", "text": "build 41 failed", "id": "b41"}).encode()
            signed = side.headers(body)
            unsigned = await side.post_raw("ci", body, {"Content-Type": "application/json"})
            forged = await side.post_raw("ci", body, side.headers(body, secret="guessed"))
            stale = await side.post_raw("ci", body, side.headers(body, timestamp=time.time() - 301))
            future = await side.post_raw("ci", body, side.headers(body, timestamp=time.time() + 301))
            first = await side.post_raw("ci", body, signed)
            replayed = await side.post_raw("ci", body, signed)
            [reply] = await side.wait_for_replies(1)
            config = gw.config
        finally:
            await gw.stop(grace_seconds=5)
    assert unsigned[0] == forged[0] == stale[0] == future[0] == replayed[0] == 401
    assert unsigned[1]["error"].startswith("unsigned: send X-Switchboard-Timestamp and X-Switchboard-Signature")
    assert forged[1]["error"].startswith("bad signature")
    assert re.fullmatch(r"stale: the timestamp is 30[12] s from now \(at most 300 s; check the sender's clock\)",
                        stale[1]["error"]), stale  # whole seconds: 301 s ago is 301 or 302 s by the time it is read
    assert replayed[1]["error"].startswith("replayed")
    assert first == (202, {"accepted": True, "id": "b41"})  # the hook needs no api.token: its secret signs it
    assert reply.body["text"] == "echo: build 41 failed | turns: 1 | first: build 41 failed"
    assert (reply.body["hook"], reply.body["conversation"], reply.body["in_reply_to"]) == ("ci", "builder", "b41")
    assert side.refused == []  # every callback carried a valid signature
    assert stored_routes(config) == ["agent:main:webhook:ci:builder:builder"]
    assert len(model.requests) == 1



async def test_a_resend_after_the_process_died_between_claim_and_store_is_taken_and_answered_once(tmp_path, side):
    # the killed process had claimed the signature in the store's ledger, then died (kill -9) before
    # the message was stored: its claim was neither marked stored nor released
    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"ci": hook(side, allowed_senders=["builder"])})
        try:
            body = json.dumps({"sender": "builder", "text": "build 41 failed", "id": "b41"}).encode()
            died_at = time.time() - 40  # the restart and the sender's retry took longer than the claim is held
            signed = side.headers(body, timestamp=died_at)
            assert await gw.db.replays.claim("webhook:ci", signed["X-Switchboard-Signature"],
                                             keep_until=died_at + 300, held_until=died_at + 30,
                                             now=died_at) == "taken"
            resent = await side.post_raw("ci", body, signed)
            [reply] = await side.wait_for_replies(1)
            replayed = await side.post_raw("ci", body, signed)  # now that it is stored: a replay

            # a twin still held (its process alive, or dead only a moment ago) is told to retry, not refused
            held = json.dumps({"sender": "builder", "text": "build 42 failed", "id": "b42"}).encode()
            held_signed = side.headers(held)
            now = time.time()
            await gw.db.replays.claim("webhook:ci", held_signed["X-Switchboard-Signature"], keep_until=now + 300,
                                      held_until=now + 600, now=now)
            busy = await side.post_raw("ci", held, held_signed)
            config = gw.config
        finally:
            await gw.stop(grace_seconds=5)
    assert resent == (202, {"accepted": True, "id": "b41"})
    assert reply.body["text"] == "echo: build 41 failed | turns: 1 | first: build 41 failed"
    assert replayed[0] == 401 and replayed[1]["error"].startswith("replayed"), replayed
    assert busy == (503, {"error": "the same signed request is being stored right now; retry shortly"})
    assert len(model.requests) == 1 and len(side.replies) == 1  # answered once
    assert stored_routes(config) == ["agent:main:webhook:ci:builder:builder"]


async def test_an_adapter_on_its_own_holds_a_claim_in_memory_until_its_request_is_stored():
    ledger = MemoryLedger()
    claim = ledger.claim
    assert await claim("webhook:ci", "sha256=aa", keep_until=1300.0, held_until=1015.0, now=1000.0) == "taken"
    assert await claim("webhook:ci", "sha256=aa", keep_until=1300.0, held_until=1016.0, now=1001.0) == "in_flight"
    assert await claim("webhook:ci", "sha256=aa", keep_until=1300.0, held_until=1031.0, now=1016.0) == "taken"
    await ledger.stored("webhook:ci", "sha256=aa")
    assert await claim("webhook:ci", "sha256=aa", keep_until=1300.0, held_until=1100.0, now=1085.0) == "replay"
    await ledger.release("webhook:ci", "sha256=aa")
    assert await claim("webhook:ci", "sha256=aa", keep_until=1300.0, held_until=1101.0, now=1086.0) == "taken"

async def test_field_paths_name_the_sender_conversation_text_and_key_for_a_payload_that_cannot_change(tmp_path, side):
    fields = {"sender": "user.id", "conversation": "thread.0.id", "text": "message.text", "idempotency_key": "event_id"}
    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"ha": hook(side, fields=fields, allowed_senders=["42"])})
        try:
            event = {"event_id": "e1", "user": {"id": 42}, "thread": [{"id": "kitchen"}], "message": {"text": "lights?"}}
            assert (await side.post("ha", event))[0] == 202
            assert (await side.post("ha", event, timestamp=time.time() + 1))[0] == 200  # retried: stored once
            missing = await side.post("ha", {"event_id": "e2", "user": {"id": 42}, "text": "wrong place"})
            await side.wait_for_replies(1)
            config = gw.config
        finally:
            await gw.stop(grace_seconds=5)
    assert missing == (400, {"error": "no text at 'message.text' (a string; platforms.webhook.hooks.<name>.fields.text)"})
    assert [r.body["conversation"] for r in side.replies] == ["kitchen"]
    assert stored_routes(config) == ["agent:main:webhook:ha:kitchen:42"]
    assert len(model.requests) == 1


async def test_a_request_that_waits_gets_the_reply_as_its_answer(tmp_path, side):
    async with FakeModel() as model:
        # no callback_url: the hook answers only those who wait
        gw = await running(tmp_path, model, side, {"sync": {"secret": side.secret, "allowed_senders": ["ann"]},
                                                   "always": {"secret": side.secret, "wait": True,
                                                              "allowed_senders": ["ann"]}})
        try:
            asked = await side.post("sync", {"sender": "ann", "text": "what time is it", "id": "w1"}, wait=True)
            by_hook = await side.post("always", {"sender": "ann", "text": "and now", "id": "w2"})
            model.delay = 2.0
            gw.adapters["webhook"]._wait_seconds = 0.5  # the longest this one is held
            late = await side.post("sync", {"sender": "ann", "text": "slow one", "id": "w3"}, wait=True)
        finally:
            await gw.stop(grace_seconds=5)
    assert asked == (200, {"accepted": True, "id": "w1",
                           "reply": "echo: what time is it | turns: 1 | first: what time is it"})
    assert by_hook[0] == 200 and by_hook[1]["reply"].startswith("echo: and now |")
    assert late == (202, {"accepted": True, "id": "w3", "pending": True})
    assert side.replies == []


async def test_allowed_senders_are_per_hook_and_a_stranger_is_offered_pairing(tmp_path, side):
    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"a": hook(side, allowed_senders=["alice"]), "b": hook(side)})
        try:
            await side.post("a", {"sender": "alice", "text": "hi from a", "id": "1"})
            await side.post("b", {"sender": "alice", "text": "hi from b", "id": "2"})  # alice is nobody on b
            await side.wait_for_replies(2)
            config = gw.config
        finally:
            await gw.stop(grace_seconds=5)
    by_hook = {r.body["hook"]: r.body["text"] for r in side.replies}
    assert by_hook["a"].startswith("echo: hi from a |")
    assert "switchboard pairing approve webhook " in by_hook["b"]
    assert [r.last_user_text for r in model.requests] == ["hi from a"]
    assert stored_routes(config) == ["agent:main:webhook:a:alice:alice"]


async def test_a_failing_callback_is_retried_with_backoff_then_set_aside_as_a_dead_letter(tmp_path, side):
    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"ci": hook(side, allowed_senders=["ann"])})
        try:
            side.fail_next(2, status=503)
            await side.post("ci", {"sender": "ann", "text": "retried", "id": "r1"})
            [ok] = await side.wait_for_replies(1)
            side.fail_next(1, status=404)  # a 4xx other than 429 will not change: not retried
            await side.post("ci", {"sender": "ann", "text": "gone", "id": "r2"})
            await eventually(lambda: len(side.calls) >= 4, 10, "the refused callback")
            dead = await eventually(lambda: _dead_letters(gw), 10, "the dead letter")
        finally:
            await gw.stop(grace_seconds=5)
    assert ok.body["text"].startswith("echo: retried |") and len(side.calls) == 4  # 503, 503, 200, then the 404
    assert side.calls[2][0] - side.calls[0][0] >= 0.7  # backoff between the attempts
    [letter] = dead
    assert letter["platform"] == "webhook" and letter["event_id"].startswith("reply:r-")
    assert '"in_reply_to": "r2"' in letter["payload"] and "answered 404" in letter["error"]


async def _dead_letters(gw):
    rows = await gw.db.dead_letters.list(status="held", limit=10)
    return rows or None


async def test_a_cron_job_delivers_to_a_hook(tmp_path, side):
    async with FakeModel() as model:
        model.script(Reply("Nightly build is green."))
        gw = await running(tmp_path, model, side, {"ci": hook(side)},
                           cron={"jobs": [{"id": "nightly", "schedule": "0 3 * * *", "prompt": "How is the build?",
                                           "deliver": "webhook:ci:ops"}]})
        try:
            run = await gw.cron.run_job("nightly")
            [reply] = await side.wait_for_replies(1)
        finally:
            await gw.stop(grace_seconds=5)
    assert (run["status"], run["delivery"]) == ("ok", "delivered")
    assert (reply.body["hook"], reply.body["conversation"], reply.body["in_reply_to"]) == ("ci", "ops", None)
    assert reply.body["text"].endswith("Nightly build is green.")


async def test_the_hooks_answer_503_while_the_platform_is_off_and_404_for_an_unknown_hook(tmp_path, side):
    async with FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url)
        gw = Gateway(config, serve_api=True)
        await gw.start()
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"http://127.0.0.1:{gw.api.bound_port}/webhooks/ci", data=b"{}") as r:
                    off = (r.status, r.headers.get("Retry-After"), await r.json())
        finally:
            await gw.stop(grace_seconds=5)
    assert off[:2] == (503, "5") and off[2]["error"].startswith("webhook is not running in this process")


CONFIG_ERRORS = [
    ({"hooks": {"ci": {}}}, "platforms.webhook.hooks.ci.secret",
     "is not set; every hook needs its own secret (generate one with: openssl rand -hex 32)"),
    ({"hooks": {"c i": {"secret": "x"}}}, "platforms.webhook.hooks.c i",
     "a hook's name is 1-64 letters, digits, _ or -, starting with a letter or digit"),
    ({"hooks": {"ci": {"secret": "x", "fields": {"text": "a..b"}}}}, "platforms.webhook.hooks.ci.fields.text",
     'must be a dotted path into the JSON body, like message.text (got "a..b")'),
    ({"hooks": {"ci": {"secret": "x", "callback": "https://x"}}}, "platforms.webhook.hooks.ci.callback", None),
]


@pytest.mark.parametrize("section,key,message", CONFIG_ERRORS, ids=["no secret", "bad name", "bad path", "typo"])
def test_a_bad_hook_is_refused_naming_its_key(section, key, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict({"platforms": {"webhook": section}}, env={})
    assert info.value.key == key, str(info.value)
    if message:
        assert str(info.value) == f"{key}: {message}"


def test_a_hooks_allowed_senders_are_its_users_and_its_secret_is_redacted():
    cfg = config_from_dict({"platforms": {"webhook": {"hooks": {"ci": {"secret": "s3cret-value", "allowed_senders": ["bot"]}}}}},
                           env={})
    assert cfg.allowed_user_ids("webhook") == frozenset({"ci/bot"})
    assert cfg.enabled_platforms()["webhook"] == "on"
    assert "s3cret-value" not in json.dumps(cfg.redacted())


async def test_doctor_healthz_and_metrics_know_the_webhook_platform(tmp_path, side):
    from gateway.cli.doctor import check_platforms

    async with FakeModel() as model:
        gw = await running(tmp_path, model, side, {"ci": hook(side, allowed_senders=["ann"])})
        try:
            await side.post("ci", {"sender": "ann", "text": "counted", "id": "c1"})
            await side.wait_for_replies(1)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{side.gateway_url}/healthz") as r:
                    health = await r.json()
                async with http.get(f"{side.gateway_url}/metrics") as r:
                    metrics = await r.text()
                checks = await check_platforms(http, gw.config)
        finally:
            await gw.stop(grace_seconds=5)
    assert health["platforms"]["webhook"]["state"] == "connected"
    assert health["platforms"]["webhook"]["detail"] == "1 hook(s) on the local API: /webhooks/ci"
    assert 'switchboard_messages_in_total{platform="webhook"} 1.0' in metrics
    assert [(c.name, c.ok, c.detail) for c in checks if c.name == "webhook"] == [
        ("webhook", True, "on: 1 hook(s) on the local API (/webhooks/ci); the senders sign their requests")]
