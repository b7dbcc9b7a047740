"""``gateway.control.Requests``: the one entry of a caller answered in its own response (the local API,
the terminal chat, an A2A endpoint): a ``Request`` in, a plain ``Reply`` out, the answer streamed to the
request's sink meanwhile."""

from __future__ import annotations

import pytest

import state
from gateway.control import Reply, Request
from gateway.types import ChatType, InboundMessage
from tests.fakes.model_server import FakeModel
from tests.harness import running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


class Collected:
    """A :class:`gateway.turn.ReplySink` that keeps what it is fed."""

    def __init__(self) -> None:
        self.text = ""

    def feed(self, delta: str) -> None:
        self.text += delta

    def show_status(self, line: str) -> None:
        pass

    def discard_text(self) -> None:
        self.text = ""


def _msg(user: str, text: str, message_id: str | None = None) -> InboundMessage:
    return InboundMessage(platform="api", chat_type=ChatType.DM, chat_id=user, user_id=user, user_name=user,
                          text=text, message_id=message_id)


async def test_a_request_the_gateway_keeps_is_answered_with_a_plain_reply_streamed_to_its_sink(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        requests = gw.router.requests
        msg = _msg("ann", "hello", "m1")
        key = requests.key_for(msg)
        sink = Collected()
        reply = await requests.submit(key, Request(msg, sink=sink))
        routed = await gw.db.routes.get(key)
        stored = [(m.role, m.content) for m in await gw.db.messages.get(routed)]
    assert isinstance(reply, Reply)
    assert (reply.text, reply.session_key, reply.session_id, reply.message_id) == \
        ("echo: hello | turns: 1 | first: hello", key, routed, "m1")
    assert (reply.failure, reply.held_for, reply.replayed, reply.tool_calls) == (None, None, False, ())
    assert reply.prompt_tokens > 0 and reply.model is not None
    assert sink.text == reply.text
    assert stored == [("user", "hello"), ("assistant", reply.text)]


async def test_a_request_with_its_own_store_is_answered_in_the_session_it_names_and_replayed_when_told(
        tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        requests, db = gw.router.requests, gw.db
        key = "agent:main:api:own:conversation-1"
        session_id = state.new_session_id()
        stored_when: list[str] = []

        async def store() -> str:
            await db.sessions.create(session_id, "api", "model", "ann", None, session_key=key, user_name="ann")
            await db.routes.set(key, session_id)
            await db.messages.append_many(session_id, [{"role": "user", "content": "from the client"}])
            stored_when.append("at its turn")
            return session_id

        async def answered_before() -> None:
            return None

        begun = await requests.begin(key, Request(_msg("ann", "from the client"), store=store))
        assert begun is not None
        reply = await begun.reply
        replayed = await requests.submit(key, Request(_msg("ann", "from the client"), store=answered_before))
    assert (reply.text, reply.session_id, reply.session_key) == \
        ("echo: from the client | turns: 1 | first: from the client", session_id, key)
    assert begun.session_id == session_id and stored_when == ["at its turn"]
    assert replayed is not None and (replayed.replayed, replayed.text) == (True, "")


async def test_a_kept_request_under_another_key_is_refused_and_nothing_is_stored(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        requests = gw.router.requests
        msg = _msg("bob", "hi")
        with pytest.raises(ValueError, match="key_for"):
            await requests.submit("agent:main:api:dm:someone-else", Request(msg))
        routed = await gw.db.routes.get(requests.key_for(msg))
    assert routed is None and model.requests == []
