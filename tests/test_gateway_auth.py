"""Authorization and pairing through the gateway.

The platform here is a stand-in speaking the gateway's adapter protocol
(``gateway.types.Adapter``); the real platforms' own end-to-end tests live
beside their adapters.
"""

import pytest
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.types import AdapterHealth, ChatRef, ChatType, Delivery, InboundMessage
from tests.fakes.model_server import FakeModel
from tests.harness import eventually, running_gateway


class StandInPlatform:
    platform = "telegram"

    def __init__(self):
        self.sent: list[tuple[ChatRef, str]] = []
        self.handler = None

    async def start(self, handler, *, dead_letter=None):
        self.handler = handler

    async def send(self, chat, text, *, reply_to=None, progress=None):
        self.sent.append((chat, text))
        if progress is not None:
            await progress.confirmed(str(len(self.sent)), last=True)
        return Delivery(ok=True, message_ids=(str(len(self.sent)),))

    async def send_typing(self, chat):
        return None

    async def stop(self):
        return None

    def health(self):
        return AdapterHealth("telegram", state="connected")

    async def deliver(self, text, *, user="42", chat="42", chat_type=ChatType.DM, message_id=None):
        """The gateway's answer to the event: it returns once the message is stored or refused,
        False when it was dropped and nothing will be sent for it."""
        return await self.handler(InboundMessage(platform="telegram", chat_type=chat_type, chat_id=chat, user_id=user,
                                          user_name="stranger", text=text, message_id=message_id))

    async def wait_sent(self, n, timeout=10.0):
        await eventually(lambda: len(self.sent) >= n, timeout, lambda: f"{n} sends, got {self.sent}")
        return self.sent


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def _started(platform):
    await eventually(lambda: platform.handler is not None, 10, "the gateway to start the platform")


async def test_a_stranger_gets_a_pairing_code_and_nothing_else_until_approved(tmp_path, model):
    platform = StandInPlatform()
    home = tmp_path / "home"
    async with running_gateway(home, model, adapters={"telegram": platform}) as gw:
        await _started(platform)
        await platform.deliver("hello?", message_id="1")
        sent = await platform.wait_sent(1)
        text = sent[0][1]
        assert text.startswith("I don't know you yet.")
        code = text.split("switchboard pairing approve telegram ")[1].split()[0]
        assert len(code) == 8
        # asking again within the window gets no second answer, and nothing was stored
        await platform.deliver("hello???", message_id="2")
        assert len(platform.sent) == 1
        assert model.requests == []
        assert (await gw.db.transfer.stats())["sessions"] == 0

        runner = CliRunner()
        listing = runner.invoke(main, ["pairing", "list"], env={"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_CONFIG": ""})
        assert code in listing.output
        approved = runner.invoke(main, ["pairing", "approve", "telegram", code.lower()],
                                 env={"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_CONFIG": ""})
        assert approved.exit_code == 0, approved.output
        assert "Approved telegram user 42" in approved.output

        await platform.deliver("now can we talk?", message_id="3")
        sent = await platform.wait_sent(2)
        assert sent[1][1] == "echo: now can we talk? | turns: 1 | first: now can we talk?"

        revoked = runner.invoke(main, ["pairing", "revoke", "telegram", "42"],
                                env={"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_CONFIG": ""})
        assert revoked.exit_code == 0
        stored = (await gw.db.transfer.stats())["messages"]
        # refused and unanswered (the handler says nothing will be sent), and not stored: an allowed
        # message is stored before the handler returns, and only a stored one reaches the model
        assert await platform.deliver("still there?", message_id="4") is False
        assert (await gw.db.transfer.stats())["messages"] == stored
        assert len(platform.sent) == 2 and len(model.requests) == 1


async def test_strangers_in_groups_are_ignored_silently(tmp_path, model):
    platform = StandInPlatform()
    async with running_gateway(tmp_path, model, adapters={"telegram": platform}) as gw:
        await _started(platform)
        assert await platform.deliver("@bot hi", chat="-100", chat_type=ChatType.GROUP, message_id="1") is False
        assert platform.sent == [] and model.requests == []
        assert (await gw.db.transfer.stats())["sessions"] == 0


async def test_allowlisted_users_talk_and_a_redelivered_event_is_answered_once(tmp_path, model):
    platform = StandInPlatform()
    async with running_gateway(tmp_path, model, adapters={"telegram": platform},
                               auth={"allowed_users": ["telegram:42"]}) as gw:
        await _started(platform)
        await platform.deliver("hi", message_id="m1")
        await platform.wait_sent(1)
        assert await platform.deliver("hi", message_id="m1") is False  # the platform redelivers: dropped
        assert len(platform.sent) == 1 and len(model.requests) == 1
        # groups are per user by default; the stored key is the documented one
        await platform.deliver("in the group", chat="-100", chat_type=ChatType.GROUP, message_id="g1")
        await platform.wait_sent(2)
        routes = dict(await gw.db.routes.list())
    assert set(routes) == {"agent:main:telegram:dm:42", "agent:main:telegram:group:-100:42"}


async def test_pending_codes_are_capped_per_platform(tmp_path, model):
    platform = StandInPlatform()
    async with running_gateway(tmp_path, model, adapters={"telegram": platform}):
        await _started(platform)
        for user in ("1", "2", "3", "4"):
            await platform.deliver("hi", user=user, chat=user)
        sent = await platform.wait_sent(4)
    assert sum(1 for _, t in sent if t.startswith("I don't know you yet.")) == 3
    assert sent[3][1] == "I can't take new pairing requests right now. Please try again later."


async def test_a_slow_reply_shows_typing_and_a_quick_one_does_not(tmp_path):
    typing = []

    class Typist(StandInPlatform):
        async def send_typing(self, chat):
            typing.append(chat)

    platform = Typist()
    async with FakeModel(delay=1.2) as slow:
        async with running_gateway(tmp_path, slow, adapters={"telegram": platform},
                                   auth={"allowed_users": ["telegram:42"]}):
            await _started(platform)
            await platform.deliver("take your time", message_id="1")
            await platform.wait_sent(1)
            assert len(typing) >= 1
            slow.delay = 0
            typing.clear()
            await platform.deliver("quick one", message_id="2")
            await platform.wait_sent(2)
            assert typing == []
