"""End to end: fake Telegram <-> real python-telegram-bot <-> our adapter <-> the real gateway <-> fake model.

The gateway is assembled as gateway/runtime/daemon.py documents it: ``Gateway(config)``
finds the adapter through the ``switchboard.adapters`` entry point and builds
it with ``TelegramAdapter.from_config`` (``base_url`` points it at the fake).
What a user would see is asserted on the fake Telegram (messages sent back),
what is remembered on the model's requests and in state.db.
"""

from __future__ import annotations

import pytest

from adapters.telegram import TelegramAdapter
from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import gateway_config, stored_routes

ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
EVE = FakeTelegram.user(666, "Eve")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team", forum=True)


@pytest.fixture
async def world(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url,
            auth={"allowed_users": ["telegram:111", "telegram:222"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
        )
        # No adapters passed: the gateway finds TelegramAdapter through its entry point and from_config.
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            assert isinstance(gw.adapters["telegram"], TelegramAdapter)
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            yield tg, model, gw, config
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_dm_conversation_is_remembered_across_turns(world):
    tg, model, gw, config = world
    tg.dm(ANN, "my name is Ann")
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "what is my name?")
    first, second = await tg.wait_for_sent(2, timeout=10)
    assert first.chat_id == 111 and "echo: my name is Ann" in first.visible_text
    assert "echo: what is my name? | turns: 2 | first: my name is Ann" in second.visible_text
    assert stored_routes(config) == ["agent:main:telegram:dm:111"]


@pytest.mark.slow  # 14 s measured under load: `make test-fast` leaves it out
async def test_group_users_get_their_own_sessions_and_a_topic_is_its_own(world):
    tg, model, gw, config = world
    tg.in_group(TEAM, ANN, "@switchboard_bot hello from Ann")
    await tg.wait_for_sent(1, timeout=10)
    tg.in_group(TEAM, BOB, "@switchboard_bot hello from Bob")
    await tg.wait_for_sent(2, timeout=10)
    tg.in_topic(TEAM, ANN, "@switchboard_bot in the topic", thread_id=77)
    sent = await tg.wait_for_sent(3, timeout=10)
    assert [s.visible_text.split(" | ")[0] for s in sent] == [
        "echo: hello from Ann", "echo: hello from Bob", "echo: in the topic"]
    assert all("turns: 1" in s.visible_text for s in sent)  # three separate conversations
    assert (sent[2].chat_id, sent[2].thread_id) == (-1001234567890, 77)
    assert stored_routes(config) == [
        "agent:main:telegram:group:-1001234567890:111",
        "agent:main:telegram:group:-1001234567890:222",
        "agent:main:telegram:group:-1001234567890:77",
    ]


async def test_an_update_delivered_twice_is_answered_once(world):
    tg, model, gw, config = world
    update = tg.dm(ANN, "only once please")
    tg.redeliver(update)
    after = tg.dm(ANN, "next")
    await tg.wait_for_sent(2, timeout=10)
    await tg.wait_until_confirmed(after)
    assert [s.visible_text.split(" | ")[0] for s in tg.sent] == ["echo: only once please", "echo: next"]
    assert len(model.requests) == 2


async def test_a_stranger_gets_a_pairing_code_in_a_dm_and_nothing_in_a_group(world):
    tg, model, gw, config = world
    tg.in_group(TEAM, EVE, "@switchboard_bot let me in")
    tg.dm(EVE, "hello?")
    [reply] = await tg.wait_for_sent(1, timeout=10)
    last = tg.dm(ANN, "marker")
    await tg.wait_for_sent(2, timeout=10)
    await tg.wait_until_confirmed(last)
    assert reply.chat_id == 666
    assert "switchboard pairing approve telegram " in reply.visible_text
    assert [s.chat_id for s in tg.sent] == [666, 111]  # nothing went to the group
    assert len(model.requests) == 1  # the stranger never reached the model
    assert stored_routes(config) == ["agent:main:telegram:dm:111"]


async def test_an_approved_stranger_is_told_so_and_their_waiting_message_is_answered(world, tmp_path):
    import asyncio
    import re

    from click.testing import CliRunner

    from gateway.cli.main import main

    tg, model, gw, config = world
    tg.dm(EVE, "what is the capital of France?")
    [code_reply] = await tg.wait_for_sent(1, timeout=10)
    code = re.search(r"pairing approve telegram (\S+)", code_reply.visible_text).group(1)
    assert len(model.requests) == 0  # nothing reached the model before the approval
    # the operator approves from another process's CLI, on the same home
    result = await asyncio.to_thread(CliRunner().invoke, main, ["pairing", "approve", "--home", str(config.home),
                                                                "telegram", code])
    assert result.exit_code == 0, result.output
    assert "tells them so and answers the message they were waiting on" in result.output
    told, answer = (await tg.wait_for_sent(3, timeout=15))[1:]
    assert told.chat_id == 666 and told.visible_text == "You're approved: you can talk to me now. Answering your message…"
    assert answer.chat_id == 666 and "echo: what is the capital of France?" in answer.visible_text
    assert len(model.requests) == 1
    assert await gw.db.pairing.welcomes() == []  # told once: a restart does not tell them again


async def test_native_commands_reach_the_gateway_from_the_menu(world):
    tg, model, gw, config = world
    assert {c["command"] for c in tg.commands} >= {"help", "new", "reset", "status", "stop"}
    tg.dm(ANN, "first topic")
    await tg.wait_for_sent(1, timeout=10)
    tg.dm(ANN, "/new")
    await tg.wait_for_sent(2, timeout=10)
    tg.in_group(TEAM, ANN, "/help@switchboard_bot")
    await tg.wait_for_sent(3, timeout=10)
    tg.dm(ANN, "second topic")
    sent = await tg.wait_for_sent(4, timeout=10)
    assert "/new" in sent[2].visible_text and sent[2].chat_id == -1001234567890  # the help text, in the group
    assert "echo: second topic | turns: 1" in sent[3].visible_text  # a fresh session
    assert len(model.requests) == 2


async def test_webhook_mode_through_the_gateway(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(
            tmp_path / "home", model.base_url,
            auth={"allowed_users": ["telegram:111"]},
            platforms={"telegram": {"token": tg.token, "base_url": tg.base_url, "webhook_url": "https://bot.example.com/tg",
                                    "webhook_port": 0, "webhook_secret": "hook_secret_1"}},
        )
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            assert tg.webhook["url"] == "https://bot.example.com/tg" and tg.calls("getUpdates") == []
            url = gw.adapters["telegram"].webhook_local_url
            chat = FakeTelegram.private_chat(ANN)
            first = {"update_id": 1, "message": tg.message(chat, ANN, "over the webhook")}
            assert await tg.deliver_webhook(first, url, secret="forged") == 403
            assert await tg.deliver_webhook(first, url) == 200
            assert await tg.deliver_webhook(first, url) == 200  # Telegram retried: stored once
            assert await tg.deliver_webhook({"update_id": 2, "message": tg.message(chat, ANN, "marker")}, url) == 200
            await tg.wait_for_sent(2, timeout=10)
            assert [s.visible_text.split(" | ")[0] for s in tg.sent] == ["echo: over the webhook", "echo: marker"]
            assert len(model.requests) == 2
        finally:
            await gw.stop(grace_seconds=5)
