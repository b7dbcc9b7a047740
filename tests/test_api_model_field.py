"""The local API's ``model`` field names the model that answered, in every response shape: chat
completions whole and streamed (every chunk), and the Responses API whole and streamed.  The stock
openai SDK against the running gateway and fake model servers."""

from __future__ import annotations

import socket

import openai

from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Refusing:
    """The primary's address while its server is down."""

    def __init__(self, port: int):
        self.base_url = f"http://127.0.0.1:{port}/v1"


def client(gw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.api.bound_port}/v1", api_key="sk-any", max_retries=0,
                              timeout=30)


async def every_shape(gw, model: str) -> dict[str, list[str]]:
    """The ``model`` each response shape names, for one request per shape naming ``model``."""
    api = client(gw)
    seen: dict[str, list[str]] = {}
    whole = await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "whole"}])
    seen["chat"] = [whole.model]
    chunks = [c.model async for c in await api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "streamed"}], stream=True)]
    seen["chunks"] = sorted(set(chunks))
    assert len(chunks) >= 3  # the role, some content, the finish
    response = await api.responses.create(model=model, input="a response")
    seen["responses"] = [response.model]
    events = [e async for e in await api.responses.create(model=model, input="a streamed response", stream=True)]
    seen["response events"] = sorted({e.response.model for e in events if hasattr(e, "response")})
    await api.close()
    return seen


async def test_a_named_model_is_named_and_the_default_keeps_its_name(tmp_path):
    async with FakeModel() as primary, FakeModel() as alt:
        alt.responder = lambda messages: "from alt"
        models = {"alt": {"base_url": alt.base_url, "api_key": "key-alt", "name": "fake-model"}}
        async with running_gateway(tmp_path, primary, models=models) as gw:
            by_alt = await every_shape(gw, "alt")
            by_default = await every_shape(gw, "gpt-4o-mini")  # not a name under models: the chat's own model
    assert by_alt == {"chat": ["alt"], "chunks": ["alt"], "responses": ["alt"], "response events": ["alt"]}
    assert by_default == {"chat": ["fake-model"], "chunks": ["fake-model"], "responses": ["fake-model"],
                          "response events": ["fake-model"]}
    assert len(alt.requests) == 4  # each request naming alt was answered by it


async def test_a_fallback_that_answers_is_named(tmp_path):
    async with FakeModel() as backup:
        backup.responder = lambda messages: "from the backup"
        models = {"backup": {"base_url": backup.base_url, "api_key": "key-backup", "name": "m-backup"}}
        chain = {"model": {"name": "m-primary", "fallbacks": ["backup"], "max_retries": 1}}
        async with running_gateway(tmp_path, Refusing(closed_port()), models=models, **chain) as gw:
            seen = await every_shape(gw, "gpt-4o-mini")
    assert seen == {"chat": ["backup"], "chunks": ["backup"], "responses": ["backup"], "response events": ["backup"]}
    assert len(backup.requests) == 4
