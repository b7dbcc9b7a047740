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

import pytest

from gateway.runtime.daemon import Gateway
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
