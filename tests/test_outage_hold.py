"""Messages a model outage left unanswered are answered when it clears, without the user writing again."""

from __future__ import annotations

import json

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import Fail, FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config

ANN = FakeTelegram.user(111, "Ann")


async def test_a_message_sent_while_the_model_fails_is_answered_when_it_is_back(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                model={"max_retries": 0, "streaming": False},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            model.script(Fail(503, message="overloaded"), Fail(503, message="overloaded"))
            tg.dm(ANN, "are you there?")
            told = (await tg.wait_for_sent(1, timeout=15))[0]
            assert told.visible_text.startswith("The model is unavailable right now")
            assert "I'll answer it when the model is back" in told.visible_text
            tg.dm(ANN, "hello again")  # while it is down: held with the first, not told twice
            answered = await tg.wait_for_sent(2, timeout=30)  # the script runs out: the model answers again
        finally:
            await gw.stop(grace_seconds=5)
    texts = [s.visible_text for s in answered]
    assert len(texts) == 2 and texts[0] == told.visible_text
    assert "echo: hello again" in texts[1] and "first: are you there?" in texts[1]  # both answered in one turn
    assert sum("unavailable" in t for t in texts) == 1


async def test_a_held_message_is_answered_with_the_chat_as_it_is_when_the_model_is_back(tmp_path):
    """The first message into an idle chat has its turn's context read as it is stored; held back by an
    outage, it is answered later with the chat's choices as they are then: ``/facts off`` sent meanwhile holds."""
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111"]},
                                model={"max_retries": 0, "streaming": False},
                                facts={"extract_delay_seconds": 0},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            await gw.services.facts.service.remember("main", "telegram:111", "Ann's favourite editor is Helix",
                                                     ["helix", "editor"])
            tg.dm(ANN, "hello")  # the chat's session starts
            await tg.wait_for_sent(1, timeout=15)
            await tg.wait_for(lambda: not gw.router.working_on("agent:main:telegram:dm:111"), what="an idle chat")
            model.script(Fail(503, message="overloaded"))
            tg.dm(ANN, "which editor should I configure?")
            told = (await tg.wait_for_sent(2, timeout=15))[1]
            assert told.visible_text.startswith("The model is unavailable right now")
            tg.dm(ANN, "/facts off")  # while the message waits for the model
            answered = (await tg.wait_for_sent(4, timeout=30))[1:]
        finally:
            await gw.stop(grace_seconds=5)
    texts = [s.visible_text for s in answered]
    assert any(t.startswith("Fact recall is off for this chat") for t in texts)
    asked = [r for r in model.requests if "which editor should I configure?" in json.dumps(r.messages)]
    assert len(asked) == 2  # the failed call, and the answer once the model was back
    assert "Ann's favourite editor is Helix" in asked[0].messages[-1]["content"]  # recall was on when it first ran
    assert asked[1].messages[-1] == {"role": "user", "content": "which editor should I configure?"}
    assert "Helix" not in json.dumps(asked[1].messages)
