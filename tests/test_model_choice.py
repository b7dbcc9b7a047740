"""A model per chat: ``/model`` lists and switches among the named models (``models:`` and ``default``),
remembered in the store; ``models.<name>.allowed_for`` limits who may use one; the local API's ``model``
field and a cron job's ``model`` choose among the same names.  Two fake model servers, one per named
model, record which one a turn reached."""

from __future__ import annotations

import openai
import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import ApiClient, gateway_config, running_gateway

ANN = FakeTelegram.user(111, "Ann")


def fast(fake: FakeModel, **extra) -> dict:
    return {"models": {"fast": {"base_url": fake.base_url, "api_key": "key-fast", "name": "m-fast", **extra}}}


async def answered_by(primary: FakeModel, other: FakeModel) -> list[str]:
    """Which server answered each call so far, in order ("default", "fast")."""
    calls = [(r.at, "default", r.body.get("model")) for r in primary.requests]
    calls += [(r.at, "fast", r.body.get("model")) for r in other.requests]
    return [f"{who}:{model}" for _, who, model in sorted(calls)]


async def test_model_lists_switches_and_is_remembered_after_a_restart(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            assert await api.say("ann", "/model") == (
                "Models here: default (current), fast. /model NAME switches this chat to another.")
            await api.say("ann", "before")
            assert await api.say("ann", "/model fast") == "This chat now uses the model fast."
            await api.say("ann", "after")
            await api.say("bob", "another chat")  # Bob's chat keeps the default
            await api.close()
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            assert await api.say("ann", "/model") == (
                "Models here: default, fast (current). /model NAME switches this chat to another.")
            await api.say("ann", "after a restart")
            await api.close()
    assert await answered_by(primary, other) == ["default:fake-model", "fast:m-fast", "default:fake-model",
                                                  "fast:m-fast"]
    assert [r.last_user_text for r in other.requests] == ["after", "after a restart"]


async def test_an_unknown_name_answers_with_the_valid_ones_and_changes_nothing(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            assert await api.say("ann", "/model gpt-4o") == (
                "There is no model 'gpt-4o' you can use here. Models here: default, fast.")
            await api.say("ann", "hello")
            await api.close()
    assert len(primary.requests) == 1 and other.requests == []


async def test_allowed_for_keeps_a_model_from_other_users_and_a_choice_never_widens_it(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other, allowed_for=["api:ann"])) as gw:
            api = ApiClient(gw)
            assert await api.say("bob", "/model") == "Models here: default (current). /model NAME switches this chat to another."
            assert await api.say("bob", "/model fast") == (
                "There is no model 'fast' you can use here. Models here: default.")
            assert await api.say("ann", "/model fast") == "This chat now uses the model fast."
            await api.say("bob", "from bob")
            await api.say("ann", "from ann")
            with pytest.raises(openai.BadRequestError) as refused:  # the request's model field: the same rule
                await api.client.chat.completions.create(
                    model="fast", messages=[{"role": "user", "content": "let me in"}],
                    extra_headers={"X-Session-Key": "bob"})
            await api.close()
    assert "the model 'fast' is not available to this caller; use one of: default" in str(refused.value)
    assert [r.last_user_text for r in primary.requests] == ["from bob"]
    assert [r.last_user_text for r in other.requests] == ["from ann"]


async def test_a_stored_choice_is_dropped_when_allowed_for_no_longer_lets_the_chat_use_it(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            await api.say("ann", "/model fast")
            await api.close()
        async with running_gateway(tmp_path, primary, **fast(other, allowed_for=["api:carol"])) as gw:
            api = ApiClient(gw)
            await api.say("ann", "still fast?")
            assert await api.say("ann", "/model") == "Models here: default (current). /model NAME switches this chat to another."
            await api.close()
    assert [r.last_user_text for r in primary.requests] == ["still fast?"] and other.requests == []


async def test_the_api_model_field_chooses_a_named_model_and_other_names_keep_the_chats_model(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            for model, text in (("fast", "one"), ("gpt-4o", "two"), ("switchboard", "three"), ("default", "four")):
                await api.client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}], extra_headers={"X-Session-Key": "ann"})
            await api.client.chat.completions.create(  # the client keeps the history: the same names choose
                model="fast", messages=[{"role": "user", "content": "five"}], user="carol")
            await api.close()
    assert [r.last_user_text for r in other.requests] == ["one", "five"]
    assert [r.last_user_text for r in primary.requests] == ["two", "three", "four"]


async def test_a_telegram_chat_switches_model_end_to_end(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as primary, FakeModel() as other:
        overrides = {**fast(other), "auth": {"allowed_users": ["telegram:111"]},
                     "platforms": {"telegram": {"token": tg.token, "base_url": tg.base_url}}}
        config = gateway_config(tmp_path / "home", primary.base_url, **overrides)
        for _ in range(2):  # the second run is a restart: the choice is still there
            gw = Gateway(config, serve_api=False)
            await gw.start()
            try:
                await tg.wait_for(lambda g=gw: g.health()["platforms"]["telegram"]["state"] == "connected",
                                  what="connected")
                said = ["/model", "/model fast", "hi fast"] if not tg.sent else ["/model", "hi again"]
                for text in said:  # one at a time: each answered before the next is sent
                    tg.dm(ANN, text)
                    sent = await tg.wait_for_sent(len(tg.sent) + 1, timeout=10)
            finally:
                await gw.stop(grace_seconds=5)
    texts = [s.visible_text for s in sent]
    assert texts[0] == "Models here: default (current), fast. /model NAME switches this chat to another."
    assert texts[1] == "This chat now uses the model fast."
    assert "echo: hi fast" in texts[2]
    assert texts[3] == "Models here: default, fast (current). /model NAME switches this chat to another."
    assert "echo: hi again" in texts[4]
    assert primary.requests == [] and [r.last_user_text for r in other.requests] == ["hi fast", "hi again"]


async def test_a_cron_job_runs_on_its_named_model(tmp_path):
    job = {"id": "digest", "name": "Digest", "schedule": "every 1h", "prompt": "digest please", "model": "fast"}
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, cron={"jobs": [job]}, **fast(other)) as gw:
            run = await gw.cron.run_job("digest")
    assert run["status"] == "ok"
    assert primary.requests == [] and [r.body["model"] for r in other.requests] == ["m-fast"]


async def test_v1_models_lists_the_named_models_a_request_can_choose_and_hides_limited_ones(tmp_path):
    async with FakeModel() as primary, FakeModel() as other, FakeModel() as third:
        extra = fast(other)
        extra["models"]["private"] = {"base_url": third.base_url, "api_key": "k", "name": "m-private",
                                      "allowed_for": ["api:ann"]}
        async with running_gateway(tmp_path, primary, model={"name": "my-model-7b"}, **extra) as gw:
            api = ApiClient(gw)
            listed = [m.id async for m in api.client.models.list()]
            one = await api.client.models.retrieve("fast")
            with pytest.raises(openai.NotFoundError) as unknown:
                await api.client.models.retrieve("private")
            await api.close()
    assert listed == ["my-model-7b", "fast"]
    assert one.id == "fast"
    assert "'my-model-7b', 'fast', not 'private'" in str(unknown.value)


async def test_the_responses_api_model_field_chooses_a_named_model_in_a_kept_conversation(tmp_path):
    async with FakeModel() as primary, FakeModel() as other:
        async with running_gateway(tmp_path, primary, **fast(other)) as gw:
            api = ApiClient(gw)
            first = await api.client.responses.create(model="default", input="one", conversation="c1")
            await api.client.responses.create(model="fast", input="two", conversation="c1")
            await api.client.responses.create(model="default", input="three", previous_response_id=first.id)
            await api.client.responses.create(model="fast", input="four", previous_response_id=first.id)
            await api.close()
    assert [r.last_user_text for r in primary.requests] == ["one", "three"]
    assert [r.last_user_text for r in other.requests] == ["two", "four"]
