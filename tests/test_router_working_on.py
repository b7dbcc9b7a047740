"""``SessionRouter.working_on(key)``: whether this process has a turn running or messages queued for a
session key (what a restart's recovery asks before sending a stored reply for that key again)."""

from __future__ import annotations

import pytest

from gateway.types import ChatType, InboundMessage
from tests.fakes.model_server import FakeModel, Hang
from tests.harness import eventually, running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


def _dm(user: str, message_id: str, text: str) -> InboundMessage:
    return InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=user, user_id=user, user_name=user,
                          text=text, message_id=message_id)


async def test_working_on_a_key_while_its_turn_runs_or_its_messages_wait_and_not_after(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        router = gw.router
        bob = await router.handle(_dm("bob", "b1", "hi"))
        bob_reply = await bob.reply
        bob_key = bob.session_key
        await eventually(lambda: not router.working_on(bob_key), 10, "bob's lane to drain")

        model.script(Hang(3.0))  # alice's first turn waits on the model for three seconds
        first = await router.handle(_dm("alice", "a1", "hello"))
        key = first.session_key
        await model.wait_for_requests(2)  # alice's turn is now running, nothing queued behind it
        during_turn = router.working_on(key)
        second = await router.handle(_dm("alice", "a2", "are you there?"))
        queued = router.queued_messages()
        with_a_queue = router.working_on(key)
        others = {"bob": router.working_on(bob_key), "None": router.working_on(None), "empty": router.working_on(""),
                  "a key never seen": router.working_on("agent:main:api:dm:carol")}
        replies = [await first.reply, await second.reply]
        await eventually(lambda: not router.working_on(key), 10, "alice's lane to drain")
        after = router.working_on(key), router.queued_messages()

    assert bob_reply == "echo: hi | turns: 1 | first: hi"
    assert (during_turn, queued, with_a_queue) == (True, 1, True)
    assert others == {"bob": False, "None": False, "empty": False, "a key never seen": False}
    assert replies == ["echo: hello | turns: 1 | first: hello",
                       "echo: are you there? | turns: 2 | first: hello"]
    assert after == (False, 0)
