"""End to end: fake Discord <-> real discord.py <-> our adapter <-> the real gateway <-> fake model.

The gateway is assembled as gateway/runtime/daemon.py documents it: ``Gateway(config,
adapters={...})`` with the adapter built by ``DiscordAdapter.from_config``.
What a user would see is asserted on the fake Discord (messages and
follow-ups the bot posted), what is remembered on the model's requests and
in state.db's routing table.
"""

from __future__ import annotations

import pytest

from adapters.discord import DiscordAdapter
from gateway.commands import default_commands
from gateway.config import Config
from gateway.runtime.daemon import Gateway
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.harness import stored_routes


@pytest.fixture
async def world(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test"},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}", f"discord:{dc.bob['id']}"]},
            "platforms": {
                "discord": {"token": dc.token, "api_base_url": dc.api_base_url, "gateway_url": dc.gateway_url,
                            "stall_timeout_seconds": 30},
                "telegram": {"enabled": False},
                "slack": {"enabled": False},
            },
            "shutdown": {"grace_seconds": 2},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=default_commands().menu(),
                                             vision=config.model.vision)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            yield dc, model, gw, config
        finally:
            await gw.stop()


def head(msg: dict) -> str:
    return msg["content"].split(" | ")[0]


async def test_a_dm_conversation_is_remembered_across_turns(world):
    dc, model, gw, config = world
    await dc.dm(dc.alice, "my name is Alice")
    await dc.wait_for_sent(1, timeout=10)
    await dc.dm(dc.alice, "what is my name?")
    first, second = await dc.wait_for_sent(2, timeout=10)
    assert first["channel_id"] == dc.alice["dm_channel_id"] and "echo: my name is Alice" in first["content"]
    assert "echo: what is my name? | turns: 2 | first: my name is Alice" in second["content"]
    assert stored_routes(config) == [f"agent:main:discord:dm:{dc.alice['dm_channel_id']}"]


async def test_channel_users_get_their_own_sessions_and_a_thread_is_its_own(world):
    dc, model, gw, config = world
    at = dc.mention(dc.bot)
    await dc.channel_message(dc.general, dc.alice, f"{at} hello from Alice", mentions=(dc.bot,))
    await dc.wait_for_sent(1, timeout=10)
    await dc.channel_message(dc.general, dc.bob, f"{at} hello from Bob", mentions=(dc.bot,))
    await dc.wait_for_sent(2, timeout=10)
    await dc.channel_message(dc.thread, dc.alice, f"{at} in the thread", mentions=(dc.bot,))
    sent = await dc.wait_for_sent(3, timeout=10)
    assert [head(s) for s in sent] == ["echo: hello from Alice", "echo: hello from Bob", "echo: in the thread"]
    assert all("turns: 1" in s["content"] for s in sent)  # three separate conversations
    assert [s["channel_id"] for s in sent] == [dc.general["id"], dc.general["id"], dc.thread["id"]]
    general, thread = dc.general["id"], dc.thread["id"]
    assert stored_routes(config) == sorted([
        f"agent:main:discord:channel:{general}:{dc.alice['id']}",
        f"agent:main:discord:channel:{general}:{dc.bob['id']}",
        f"agent:main:discord:group:{general}:{thread}",
    ])
    # Each answer in the channel is a reply to its question.
    assert sent[0]["request"]["message_reference"]["message_id"] is not None


async def test_an_event_delivered_twice_is_answered_once(world):
    dc, model, gw, config = world
    payload = await dc.dm(dc.alice, "only once please")
    await dc.wait_for_sent(1, timeout=10)
    await dc.redeliver(payload)
    await dc.dm(dc.alice, "marker")  # answered after the duplicate was handled: nothing more came of it
    sent = await dc.wait_for_sent(2, timeout=10)
    assert [head(s) for s in sent] == ["echo: only once please", "echo: marker"]
    assert "turns: 2" in sent[1]["content"]  # the duplicate was not stored a second time
    assert len(dc.sent()) == 2 and len(model.requests) == 2


async def test_a_stranger_gets_a_pairing_code_in_a_dm_and_nothing_in_a_channel(world):
    dc, model, gw, config = world
    eve = dc.add_user("eve")
    await dc.channel_message(dc.general, eve, f"{dc.mention(dc.bot)} let me in", mentions=(dc.bot,))
    await dc.dm(eve, "hello?")
    [reply] = await dc.wait_for_sent(1, timeout=10)
    await dc.dm(dc.alice, "marker")
    sent = await dc.wait_for_sent(2, timeout=10)
    assert reply["channel_id"] == eve["dm_channel_id"]
    assert "switchboard pairing approve discord " in reply["content"]
    assert [s["channel_id"] for s in sent] == [eve["dm_channel_id"], dc.alice["dm_channel_id"]]
    assert len(model.requests) == 1  # the stranger never reached the model
    assert stored_routes(config) == [f"agent:main:discord:dm:{dc.alice['dm_channel_id']}"]


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
async def test_slash_commands_are_registered_and_answered_by_follow_up(world):
    dc, model, gw, config = world
    assert {c["name"] for c in dc.registered_commands} >= {"help", "new", "reset", "status", "stop"}
    await dc.dm(dc.alice, "first topic")
    await dc.wait_for_sent(1, timeout=10)
    interaction = await dc.slash_command("new", dc.alice)
    await dc.wait_for_sent(2, timeout=10)
    help_cmd = await dc.slash_command("help", dc.bob, channel=dc.general)
    await dc.wait_for_sent(3, timeout=10)
    await dc.dm(dc.alice, "second topic")
    sent = await dc.wait_for_sent(4, timeout=10)
    assert [c["type"] for c in dc.interaction_callbacks] == [5, 5]  # both deferred
    new_reply, help_reply = dc.followups
    assert new_reply["interaction_token"] == interaction["token"]
    assert help_reply["interaction_token"] == help_cmd["token"] and "/new" in help_reply["content"]
    assert "echo: second topic | turns: 1" in sent[3]["content"]  # a fresh session after /new
    assert len(model.requests) == 2


async def test_a_strangers_slash_command_in_a_channel_is_withdrawn_not_left_thinking(world):
    dc, model, gw, config = world
    eve = dc.add_user("eve")
    interaction = await dc.slash_command("status", eve, channel=dc.general)
    await dc.wait_until(lambda: interaction["token"] in dc.withdrawn, 10, "the deferred answer withdrawn")
    assert dc.followups == [] and model.requests == []
    # a stranger's slash command in a DM still gets the pairing code, as its follow-up
    dm_cmd = await dc.slash_command("status", eve)
    await dc.wait_until(lambda: len(dc.followups) == 1, 10, "a follow-up")
    assert dc.followups[0]["interaction_token"] == dm_cmd["token"]
    assert "switchboard pairing approve discord " in dc.followups[0]["content"]
    assert dm_cmd["token"] not in dc.withdrawn
