"""Helpers to run the real gateway in-process against a fake model server (tests and benchmarks)."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path

import openai

import state
from gateway.config import config_from_dict
from gateway.runtime.daemon import Gateway
from tests.waiting import eventually  # noqa: F401 - re-exported: tests import it from here


class Clock:
    """Real time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def gateway_config(home: Path, model_base_url: str, **overrides):
    data = {
        "home": str(home),
        "model": {"base_url": model_base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000",
                  "max_retries": 3, "retry_total_seconds": 20, "context_length": 32768},
        "api": {"host": "127.0.0.1", "port": 0},
        "logging": {"level": "INFO", "format": "text"},
    }
    return config_from_dict(merge(data, overrides))


@asynccontextmanager
async def running_gateway(home: Path, fake_model, /, *, clock=None, adapters=None, **overrides):
    cfg = gateway_config(home, fake_model.base_url, **overrides)
    gw = Gateway(cfg, adapters=adapters if adapters is not None else {}, clock=clock or time.time)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(grace_seconds=5)


class ApiClient:
    """The real openai SDK talking to the gateway's local API."""

    def __init__(self, gw: Gateway):
        self.client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1",
                                         api_key=gw.config.api.token or "unused", max_retries=0, timeout=30)

    async def say(self, key: str, text: str) -> str:
        resp = await self.client.chat.completions.create(
            model="switchboard", messages=[{"role": "user", "content": text}], extra_headers={"X-Session-Key": key},
        )
        return resp.choices[0].message.content

    async def failure(self, key: str, text: str) -> tuple[int, str]:
        """A request the gateway answers with an error (the model failed): its status and message."""
        try:
            await self.say(key, text)
        except openai.APIStatusError as exc:
            return exc.status_code, exc.body["message"] if isinstance(exc.body, dict) else str(exc.body)
        raise AssertionError(f"{text!r} was answered, not refused")

    async def close(self) -> None:
        await self.client.close()


def stored_routes(config) -> list[str]:
    """The session keys the gateway stored routes for, sorted (what the key tests compare)."""
    with state.SessionDB(config.db_path) as db:
        return sorted(key for key, _ in db.routes.list())
