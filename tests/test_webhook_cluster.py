"""Webhooks on a cluster: several instances behind one URL share the store's record of accepted
signatures, so a replayed signed delivery is refused by every instance, not only the one that took it.

Two real gateways (each its own home and local API) on one PostgreSQL database, the hook the same on
both; tests/fakes/webhook.py signs the requests and receives the replies.

    .venv/bin/python -m pytest -q -n 0 tests/test_webhook_cluster.py
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import psycopg
import pytest
import yaml

from gateway.runtime.daemon import Gateway
from tests.clusterdaemons import instance_dir, instance_settings
from tests.crashkit import Daemon
from tests.fakes.model_server import FakeModel
from tests.fakes.webhook import FakeHookSide
from tests.harness import eventually, gateway_config

pytestmark = pytest.mark.timeout(180)


async def instance(stack: AsyncExitStack, tmp_path, name: str, url: str, model: FakeModel, side: FakeHookSide):
    config = gateway_config(tmp_path / name, model.base_url, store={"url": url}, cluster={"instance_id": name},
                            auth={"allow_all": True},
                            platforms={"webhook": {"hooks": {"ci": {"secret": side.secret,
                                                                    "callback_url": side.callback_url}}}})
    gw = Gateway(config, serve_api=True)
    await gw.start()
    stack.push_async_callback(gw.stop, grace_seconds=5)
    await eventually(lambda: gw.health()["platforms"]["webhook"]["state"] == "connected", 15, f"{name} connected")
    return f"http://127.0.0.1:{gw.api.bound_port}"


async def test_a_delivery_replayed_to_another_instance_is_refused_there(tmp_path, pg_url):
    async with FakeModel() as model, FakeHookSide() as side, AsyncExitStack() as stack:
        a = await instance(stack, tmp_path, "a", pg_url, model, side)
        b = await instance(stack, tmp_path, "b", pg_url, model, side)

        async def post(at: str, body: bytes, headers: dict) -> tuple[int, dict]:
            side.gateway_url = at
            return await side.post_raw("ci", body, headers)

        first = json.dumps({"sender": "builder", "text": "build 41 failed", "id": "b41"}).encode()
        signed = side.headers(first)
        taken = await post(a, first, signed)
        replayed_elsewhere = await post(b, first, signed)
        replayed_here = await post(a, first, signed)

        second = json.dumps({"sender": "builder", "text": "build 42 failed", "id": "b42"}).encode()
        signed_second = side.headers(second)
        taken_by_b = await post(b, second, signed_second)
        replayed_on_a = await post(a, second, signed_second)

        # the same signed delivery at both instances at once: one takes it
        third = json.dumps({"sender": "builder", "text": "build 43 failed", "id": "b43"}).encode()
        signed_third = side.headers(third)
        side.gateway_url = a
        at_a = asyncio.ensure_future(side.post_raw("ci", third, signed_third))
        await asyncio.sleep(0)
        side.gateway_url = b
        at_b = asyncio.ensure_future(side.post_raw("ci", third, signed_third))
        racing = sorted([(await at_a)[0], (await at_b)[0]])

        # a retry signed afresh is no replay: the idempotency key answers it once
        side.gateway_url = b
        retried = await side.post("ci", {"sender": "builder", "text": "build 41 failed", "id": "b41"},
                                  timestamp=float(signed["X-Switchboard-Timestamp"]) + 1)
        # the three deliveries are one conversation: its last reply counts the messages stored
        await eventually(lambda: any("| turns: 3 |" in t for t in side.texts("builder")), 30,
                         lambda: f"a reply counting 3 messages (have {side.texts('builder')})")
        texts = side.texts("builder")

    assert taken == (202, {"accepted": True, "id": "b41"}) and taken_by_b[0] == 202
    for refused in (replayed_elsewhere, replayed_here, replayed_on_a):
        assert refused[0] == 401 and refused[1]["error"].startswith("replayed"), refused
    assert racing == [202, 401], racing
    assert retried == (200, {"accepted": True, "id": "b41", "duplicate": True})
    assert not any("| turns: 4 |" in t for t in texts), texts  # nothing stored twice
    assert all(t.endswith("| first: build 41 failed") for t in texts), texts  # one session on both instances


async def test_a_request_whose_instance_was_killed_between_taking_and_storing_it_is_taken_when_resent(
        tmp_path, pg_url):
    # kill -9 of a real daemon in the gap: its claim on the signature is written, its message is not
    # (the test holds the messages table), so the same bytes resent to the other instance must be taken
    async with FakeModel() as model, FakeHookSide() as side:
        hooks = {"webhook": {"hooks": {"ci": {"secret": side.secret, "callback_url": side.callback_url}}}}
        daemons = [Daemon(instance_dir(tmp_path, name), instance_settings(pg_url, name, model.base_url,
                                                                          platforms=hooks))
                   for name in ("a", "b")]
        urls = [f"http://127.0.0.1:{yaml.safe_load(d.config.read_text())['api']['port']}" for d in daemons]
        await asyncio.gather(*(d.start() for d in daemons))
        try:
            body = json.dumps({"sender": "builder", "text": "build 41 failed", "id": "b41"}).encode()
            signed = side.headers(body)
            with psycopg.connect(pg_url) as holder:
                holder.execute("LOCK TABLE messages IN SHARE MODE")  # an INSERT into it waits
                side.gateway_url = urls[0]
                cut_off = asyncio.ensure_future(side.post_raw("ci", body, signed))
                await eventually(lambda: _held(pg_url), 20, "the killed instance's claim on the signature")
                await daemons[0].kill()
                holder.rollback()
            await asyncio.gather(cut_off, return_exceptions=True)
            side.gateway_url = urls[1]
            answers = []
            while not answers or answers[-1][0] == 503:  # its twin is held: retry, as the answer says
                answers.append(await side.post_raw("ci", body, signed))
                assert len(answers) < 30, answers
            await eventually(lambda: len(side.replies) >= 1, 30, "the reply to the resent request")
            replayed = await side.post_raw("ci", body, signed)
        finally:
            await asyncio.gather(*(d.stop() for d in daemons if d.proc is not None and d.proc.returncode is None))
    with psycopg.connect(pg_url) as conn:
        stored = conn.execute("SELECT content FROM messages WHERE role = 'user'").fetchall()
    assert answers[-1] == (202, {"accepted": True, "id": "b41"}), answers
    assert {status for status, _ in answers[:-1]} <= {503}, answers
    assert replayed[0] == 401 and replayed[1]["error"].startswith("replayed"), replayed
    assert stored == [("build 41 failed",)]  # stored once
    assert side.texts("builder") == ["echo: build 41 failed | turns: 1 | first: build 41 failed"]  # answered once


def _held(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM signatures_seen WHERE held_until IS NOT NULL").fetchone()[0] == 1
