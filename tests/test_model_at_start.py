"""At start the model is probed once: a server that is down, or not serving the model, is a WARNING
naming the URL and what to try, and /healthz says so at once (not "unknown" until a call fails)."""

from __future__ import annotations

import logging

import aiohttp

from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway


async def healthz(gw) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/healthz") as r:
            return await r.json()


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("gateway")]


async def test_a_url_without_v1_is_a_warning_with_the_v1_url_and_healthz_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with FakeModel() as model:
        bare = model.base_url.removesuffix("/v1")

        class Bare:  # the harness reads base_url: the address as people copy it
            base_url = bare

        async with running_gateway(tmp_path, Bare()) as gw:
            health = await healthz(gw)
    assert health["status"] == "degraded"
    assert health["model"]["state"] == "not_serving"
    assert health["model"]["last_error"] == f"{bare}/models answered 404: the OpenAI-compatible API is at {model.base_url}"
    assert health["models"]["default"]["base_url"] == bare
    assert any(w.startswith(f"model default: {bare}/models answered 404") and f"set model.base_url to {model.base_url}" in w
               for w in warnings(caplog)), warnings(caplog)


async def test_a_server_that_is_down_is_a_warning_naming_the_url(tmp_path, caplog):
    caplog.set_level(logging.INFO)

    class Nowhere:
        base_url = "http://127.0.0.1:9/v1"

    async with running_gateway(tmp_path, Nowhere()) as gw:
        health = await healthz(gw)
    assert health["status"] == "degraded" and health["model"]["state"] == "unreachable"
    assert health["model"]["last_error"] == "cannot reach http://127.0.0.1:9/v1: connection refused (nothing listens there)"
    assert any("http://127.0.0.1:9/v1" in w and "check model.base_url" in w for w in warnings(caplog))


async def test_a_server_with_other_models_names_them_and_a_good_one_is_ok_at_once(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with FakeModel(model_name="llama3.1:8b") as model:
        async with running_gateway(tmp_path, model) as gw:
            health = await healthz(gw)
    assert health["model"]["state"] == "not_serving"
    assert any("does not serve 'fake-model' (it has: llama3.1:8b)" in w and "set model.name to one of llama3.1:8b" in w
               for w in warnings(caplog))
    caplog.clear()
    async with FakeModel() as model:
        async with running_gateway(tmp_path, model) as gw:
            health = await healthz(gw)
    assert health["status"] == "ok" and health["model"]["state"] == "ok"
    assert not [w for w in warnings(caplog) if w.startswith("model ")]
