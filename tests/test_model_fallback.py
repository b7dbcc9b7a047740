"""The fallback chain (``model.fallbacks`` over named ``models``), through the real gateway and the
real openai client, against several fake model servers: one refusing connections (a closed port),
one answering 500, one answering 429 with a long Retry-After, one without vision."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from gateway.fallback import Capabilities, ChainSettings, Endpoint
from gateway.model import ModelClient, ModelSettings
from gateway.usage import CallContext, UsageRecorder
from state import AsyncSessionDB
from tests.fakes.model_server import Fail, FakeModel, Hang, refusal
from tests.harness import ApiClient, eventually, running_gateway


def closed_port() -> int:
    """A port nothing listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Refusing:
    """Where the primary is configured when its server is down."""

    def __init__(self, port: int):
        self.base_url = f"http://127.0.0.1:{port}/v1"


def named(fake: FakeModel, name: str, **caps) -> dict:
    return {"base_url": fake.base_url, "api_key": f"key-{name}", "name": name, **caps}


def answering(fake: FakeModel, text: str) -> FakeModel:
    fake.responder = lambda messages: text
    return fake


async def ledger(gw, count: int) -> list[dict]:
    async def written():
        rows = await gw.db.usage.calls()
        return rows if len(rows) >= count else None
    return await eventually(written)


def chain(*names: str, **model) -> dict:
    return {"model": {"name": "m-primary", "fallbacks": list(names), "max_retries": 1, **model}}


async def test_each_failure_moves_down_the_chain_in_order_and_the_user_sees_only_the_answer(tmp_path):
    async with FakeModel() as busy, FakeModel() as limited, FakeModel() as good:
        busy.script(*[Fail(500)] * 4)
        limited.script(Fail(429, retry_after=10))  # within retry_total_seconds, past max_wait_seconds
        answering(good, "answered by the last one")
        models = {"busy": named(busy, "m-busy"), "limited": named(limited, "m-limited"), "good": named(good, "m-good")}
        async with running_gateway(tmp_path, Refusing(closed_port()), models=models,
                                   **chain("busy", "limited", "good")) as gw:
            api = ApiClient(gw)
            assert await api.say("ann", "hello") == "answered by the last one"
            await api.close()
            rows = await ledger(gw, 4)
            health = gw.health()
    assert [(r["model"], r["outcome"], r["attempts"]) for r in rows] == [
        ("m-primary", "failed", 1),  # refused: on at once, no retry
        ("m-busy", "failed", 2),  # 500: retried as usual (max_retries 1), then on
        ("m-limited", "failed", 1),  # 429 asking for 10 s, more than max_wait_seconds: on at once
        ("m-good", "ok", 1),
    ]
    assert [len(busy.requests), len(limited.requests), len(good.requests)] == [2, 1, 1]
    assert good.requests[0].body["model"] == "m-good" and good.requests[0].headers["Authorization"] == "Bearer key-m-good"
    assert {name: (h["state"], h["breaker"]) for name, h in health["models"].items()} == {
        "default": ("unreachable", "open"), "busy": ("unreachable", "open"), "limited": ("unreachable", "open"),
        "good": ("ok", "closed")}


async def test_a_short_retry_after_is_waited_out_on_the_primary(tmp_path):
    async with FakeModel() as primary, FakeModel() as backup:
        primary.script(Fail(429, retry_after=0.3))
        answering(primary, "from the primary")
        async with running_gateway(tmp_path, primary, models={"backup": named(backup, "m-backup")},
                                   **chain("backup")) as gw:
            api = ApiClient(gw)
            assert await api.say("bo", "hello") == "from the primary"
            await api.close()
            (row,) = await ledger(gw, 1)
    assert len(primary.requests) == 2 and backup.requests == []
    assert (row["model"], row["outcome"], row["attempts"]) == ("m-primary", "retried", 2)


async def test_a_timeout_moves_on_at_once_without_a_retry(tmp_path):
    async with FakeModel() as primary, FakeModel() as backup:
        primary.script(Hang(30))
        answering(backup, "from the backup")
        async with running_gateway(tmp_path, primary, models={"backup": named(backup, "m-backup")},
                                   **chain("backup", timeout_seconds=0.5, max_retries=3)) as gw:
            api = ApiClient(gw)
            assert await api.say("fi", "hello") == "from the backup"
            await api.close()
            rows = await ledger(gw, 2)
    assert len(primary.requests) == 1  # not retried: three more timeouts would have cost 1.5 s and backoffs
    assert [(r["model"], r["outcome"], r["attempts"]) for r in rows] == [("m-primary", "failed", 1),
                                                                      ("m-backup", "ok", 1)]
    assert rows[0]["error"] == "ModelUnavailable: timed out"


async def test_a_model_the_endpoint_does_not_know_moves_on(tmp_path):
    async with FakeModel() as primary, FakeModel() as backup:
        primary.script(refusal(404))
        answering(backup, "from the backup")
        async with running_gateway(tmp_path, primary, models={"backup": named(backup, "m-backup")},
                                   **chain("backup")) as gw:
            api = ApiClient(gw)
            assert await api.say("cy", "hello") == "from the backup"
            await api.close()
            rows = await ledger(gw, 2)
    assert [(r["model"], r["outcome"]) for r in rows] == [("m-primary", "failed"), ("m-backup", "ok")]
    assert rows[0]["error"].startswith("ModelNotFound")


async def test_a_failed_primary_is_skipped_on_the_next_call_then_probed_back(tmp_path):
    port = closed_port()
    async with FakeModel() as backup:
        answering(backup, "from the backup")
        async with running_gateway(tmp_path, Refusing(port), models={"backup": named(backup, "m-backup")},
                                   **chain("backup", breaker_seconds=600)) as gw:
            api = ApiClient(gw)
            assert await api.say("di", "first") == "from the backup"
            assert await api.say("di", "second") == "from the backup"
            rows = await ledger(gw, 3)
            # the second call went straight to the backup: no failed call to the primary before it
            assert [(r["model"], r["outcome"]) for r in rows] == [
                ("m-primary", "failed"), ("m-backup", "ok"), ("m-backup", "ok")]
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{gw.api.bound_port}/metrics") as r:
                    metrics = await r.text()
            assert 'switchboard_model_up{model="default"} 0.0' in metrics
            assert 'switchboard_model_breaker_open{model="default"} 1.0' in metrics
            assert 'switchboard_model_fallbacks_total{model="default"} 1.0' in metrics
            async with FakeModel(port=port, model_name="m-primary") as primary:  # the primary is back on its port
                answering(primary, "from the primary")
                await eventually(lambda: gw.health()["models"]["default"]["breaker"] == "closed", timeout=10)
                assert await api.say("di", "third") == "from the primary"
                rows = await ledger(gw, 4)
            await api.close()
    assert (rows[-1]["model"], rows[-1]["outcome"]) == ("m-primary", "ok")


async def test_when_every_model_fails_the_user_gets_the_usual_error(tmp_path):
    async with FakeModel() as backup:
        backup.script(*[Fail(503)] * 2)
        async with running_gateway(tmp_path, Refusing(closed_port()), models={"backup": named(backup, "m-backup")},
                                   **chain("backup")) as gw:
            api = ApiClient(gw)
            status, said = await api.failure("ed", "hello")
            await api.close()
    assert (status, said) == (503, "The model is unavailable right now (HTTP 503). Your message is saved; "
                              "send another message to try again.")


IMAGE_TURN = [{"role": "user", "content": [
    {"type": "text", "text": "what is in this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]


async def test_a_fallback_without_vision_is_skipped_for_an_image_and_a_stream_falls_back_unseen(tmp_path):
    async with FakeModel() as blind, FakeModel() as seeing:
        answering(seeing, "a cat on a mat")
        db = await AsyncSessionDB.open(tmp_path / "state.db")
        settings = {"api_key": "k", "max_retries": 1, "retry_total_seconds": 5}
        client = ModelClient(
            ModelSettings(base_url=Refusing(closed_port()).base_url, name="m-primary", **settings),
            capabilities=Capabilities(vision=True), usage=UsageRecorder(db, {}), chain=ChainSettings(),
            fallbacks=[Endpoint("blind", ModelSettings(base_url=blind.base_url, name="m-blind", **settings),
                                Capabilities(vision=False)),
                       Endpoint("seeing", ModelSettings(base_url=seeing.base_url, name="m-seeing", **settings),
                                Capabilities(vision=True))])
        shown: list[str] = []
        try:
            done = await client.complete(IMAGE_TURN, on_text=shown.append,
                                         purpose=CallContext("turn", session_id=None, platform="api", chat_id="c",
                                                             user_id="u", agent="main"))
            rows = await eventually(_rows_at_least(db, 2))
        finally:
            await client.close()
            await db.close()
    assert blind.requests == [] and len(seeing.requests) == 1
    assert seeing.requests[0].body["stream"] is True
    assert "".join(shown) == "a cat on a mat" == done.message["content"]  # nothing of the failure shown
    assert [(r["model"], r["outcome"]) for r in rows] == [("m-primary", "failed"), ("m-seeing", "ok")]


def _rows_at_least(db, n: int):
    async def rows():
        found = await db.usage.calls()
        return found if len(found) >= n else None
    return rows


@pytest.mark.parametrize("fallbacks, error", [
    (["nowhere"], "model.fallbacks[0]: 'nowhere' is not a name under models"),
    (["b", "b"], "model.fallbacks[1]: 'b' is listed twice"),
])
def test_a_fallback_must_name_a_model_once(tmp_path, fallbacks, error):
    from gateway.config import config_from_dict
    from gateway.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        config_from_dict({"home": str(tmp_path), "model": {"fallbacks": fallbacks},
                          "models": {"b": {"base_url": "http://127.0.0.1:1/v1", "name": "m-b"}}})
    assert str(raised.value).startswith(error)


def test_a_named_models_key_is_a_secret_and_its_price_joins_the_pricing(tmp_path):
    from gateway.config import config_from_dict

    cfg = config_from_dict({"home": str(tmp_path), "model": {"fallbacks": ["b"]}, "models": {"b": {
        "base_url": "http://127.0.0.1:1/v1", "name": "m-b", "api_key": "sk-backup-secret",
        "pricing": {"input": 1.0, "output": 2.0}}}})
    assert cfg.redacted()["models"]["b"]["api_key"] == "***"
    assert "sk-backup-secret" in cfg.secrets()
    assert cfg.all_pricing["m-b"].as_dict() == {"input": 1.0, "output": 2.0, "cached_input": 1.0}
