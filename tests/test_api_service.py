"""The local API as an HTTP service: a busy port, bad bodies, idempotent retries, shutdown (503, draining, a second signal)."""

import asyncio
import os
import re
import signal
import socket
import sqlite3
import time

import aiohttp
import pytest

import state
from tests.fakes.model_server import FakeModel, Hang
from tests.harness import running_gateway
from tests.test_daemon_process import NotifySocket, start_daemon, write_config


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def _url(gw) -> str:
    return f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions"


def _body(text: str) -> dict:
    return {"model": "x", "messages": [{"role": "user", "content": text}]}


# -- the port ---------------------------------------------------------------------------


async def test_a_busy_api_port_is_one_line_naming_the_key_and_who_holds_it_and_exit_78(tmp_path, model):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        config = write_config(tmp_path, model.base_url, api={"port": port})
        proc = await start_daemon(config, {})
        code = await asyncio.wait_for(proc.wait(), 30)
        err = (await proc.stderr.read()).decode()
    finally:
        holder.close()
    assert code == 78, err  # RestartPreventExitStatus=78: systemd does not loop on it
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "api.port" in line]
    assert f"127.0.0.1:{port} is already in use by pid {os.getpid()} (" in line
    assert "choose another api.port" in line


# -- bad bodies --------------------------------------------------------------------------


async def test_a_lone_surrogate_in_the_body_is_a_400_naming_where_and_nothing_is_stored(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        async with aiohttp.ClientSession() as http:
            raw = b'{"messages": [{"role": "user", "content": "hi \\ud800 there"}]}'
            async with http.post(_url(gw), data=raw, headers={"X-Session-Key": "k",
                                                              "Content-Type": "application/json"}) as r:
                status, error = r.status, (await r.json())["error"]["message"]
            nested = b'{"messages": [{"role": "user", "content": "fine"}], "user": "k", "metadata": {"\\udfff": 1}}'
            async with http.post(_url(gw), data=nested, headers={"Content-Type": "application/json"}) as r:
                nested_status = r.status
        route = await gw.db.routes.get("agent:main:api:dm:k")
    assert status == 400
    assert "messages[0].content" in error and "lone UTF-16 surrogate" in error
    assert nested_status == 400
    assert route is None and model.requests == []


# -- Idempotency-Key ---------------------------------------------------------------------


async def test_a_retry_while_the_first_request_runs_is_409_then_gets_the_stored_reply(tmp_path):
    async with FakeModel(delay=1.0) as model, running_gateway(tmp_path, model) as gw:
        headers = {"X-Session-Key": "k", "Idempotency-Key": "order-42"}
        async with aiohttp.ClientSession() as http:
            first = asyncio.create_task(http.post(_url(gw), json=_body("ship it"), headers=headers))
            await model.wait_for_requests(1)
            async with http.post(_url(gw), json=_body("ship it"), headers=headers) as r:
                running = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["message"])
            async with http.post(_url(gw), json=_body("something else"), headers=headers) as r:
                other = (r.status, (await r.json())["error"]["message"])
            async with await first as r:
                answered = await r.json()
            async with http.post(_url(gw), json=_body("ship it"), headers=headers) as r:
                replayed = (r.status, await r.json())
            async with http.post(_url(gw), json=_body("something else"), headers=headers) as r:
                other_after = r.status
    assert running[:2] == (409, "1") and "still being answered" in running[2]
    assert other[0] == 422 and "already used for another request" in other[1]
    assert replayed[0] == 200
    assert replayed[1]["choices"][0]["message"]["content"] == "echo: ship it | turns: 1 | first: ship it"
    assert replayed[1]["id"] == answered["id"]
    assert other_after == 422
    assert len(model.requests) == 1


async def test_a_client_that_timed_out_gets_its_answer_after_a_restart(tmp_path, model):
    headers = {"X-Session-Key": "k", "Idempotency-Key": "evt-7"}
    async with running_gateway(tmp_path, model) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(gw), json=_body("remember me"), headers=headers) as r:
                assert r.status == 200
    async with running_gateway(tmp_path, model) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(gw), json=_body("remember me"), headers=headers) as r:
                status, body = r.status, await r.json()
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "echo: remember me | turns: 1 | first: remember me"
    assert len(model.requests) == 1


# -- shutdown ----------------------------------------------------------------------------


async def test_healthz_says_draining_and_new_messages_get_503_with_retry_after(tmp_path, model):
    from gateway.runtime.daemon import Gateway
    from tests.harness import gateway_config

    model.script(Hang(30))
    gw = Gateway(gateway_config(tmp_path, model.base_url))
    await gw.start()
    base = f"http://127.0.0.1:{gw.api.bound_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/healthz") as r:
            assert (await r.json())["status"] == "ok"
        slow = asyncio.create_task(http.post(_url(gw), json=_body("a long one"), headers={"X-Session-Key": "a"}))
        await model.wait_for_requests(1)
        stopping = asyncio.create_task(gw.stop(grace_seconds=2))
        async with http.get(base + "/healthz") as r:
            status = (await r.json())["status"]
        async with http.post(_url(gw), json=_body("hello?"), headers={"X-Session-Key": "b"}) as r:
            refused = (r.status, r.headers.get("Retry-After"))
        async with await slow as r:
            cut = (r.status, r.headers.get("Retry-After"))
        await stopping
    assert status == "draining"
    assert refused == (503, "10")
    assert cut == (503, "10")


async def test_a_second_signal_while_draining_exits_at_once(tmp_path):
    async with FakeModel() as model:
        model.script(Hang(60))
        config = write_config(tmp_path, model.base_url, shutdown={"grace_seconds": 60})
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path)})
        try:
            status = await notify.wait_for(lambda line: line.startswith("STATUS=serving"))
            port = int(re.search(r"API on 127\.0\.0\.1:(\d+)", status).group(1))
            async with aiohttp.ClientSession() as http:
                pending = asyncio.create_task(http.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=_body("take forever"),
                    headers={"X-Session-Key": "slow"}))
                await model.wait_for_requests(1)
                proc.send_signal(signal.SIGINT)
                await notify.wait_for(lambda line: line == "STOPPING=1")
                started = time.monotonic()
                proc.send_signal(signal.SIGINT)
                code = await asyncio.wait_for(proc.wait(), 10)
                took = time.monotonic() - started
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        err = (await proc.stderr.read()).decode()
    assert code == 130  # 128 + SIGINT, as a shell reports it
    assert took < 5  # not the 60 s grace period
    assert "second SIGINT while stopping: exiting now without waiting for running turns" in err
    with sqlite3.connect(tmp_path / "home" / "state.db") as conn:  # the sudden exit left a sound database
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with state.SessionDB(tmp_path / "home" / "state.db") as db:
        stored = db.messages.get(db.routes.get("agent:main:api:dm:slow"))
    assert [(m.role, m.content) for m in stored] == [("user", "take forever")]
