"""Small things a user or operator sees: blank messages, /new with a title, one log line per model call."""

from __future__ import annotations

import io
import logging

import aiohttp
import pytest

from gateway.errors import InvalidMessage
from gateway.logging_setup import setup_logging
from gateway.types import ChatType, InboundMessage
from tests.fakes.model_server import Fail, FakeModel
from tests.harness import ApiClient, running_gateway


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


async def test_a_blank_message_is_refused_by_the_api_and_dropped_from_a_platform(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "  \n\t "}], "user": "k"})
            body = await resp.json()
        blank = InboundMessage(platform="api", chat_type=ChatType.DM, chat_id="p", user_id="p", user_name="p",
                               text=" \n ", message_id="m1")
        taken = await gw.router.take(blank)  # what every platform adapter calls
        routes = [await gw.db.routes.get(key) for key in ("agent:main:api:dm:k", "agent:main:api:dm:p")]
    assert (resp.status, body["error"]["message"]) == (400, "the last user message is only whitespace: send some text")
    assert taken is False and routes == [None, None]  # nothing stored, no session made
    assert model.requests == []


async def test_a_message_without_a_chat_id_is_refused_where_an_adapter_makes_it(tmp_path, model):
    """Two senders whose adapter gave no chat id would share the session agent:main:telegram:dm:."""
    async with running_gateway(tmp_path, model) as gw:
        for user, chat_id in (("1", ""), ("2", "   "), ("3", "\x00")):
            with pytest.raises(InvalidMessage) as refused:
                await gw.router.take(InboundMessage(platform="telegram", chat_type=ChatType.DM, chat_id=chat_id,
                                                   user_id=user, text="my secret plans"))
            assert "InboundMessage.chat_id" in str(refused.value) and "refused" in str(refused.value)
        with pytest.raises(InvalidMessage, match="InboundMessage.platform"):
            InboundMessage(platform="", chat_type=ChatType.DM, chat_id="5", user_id="5", text="hi")
        assert await gw.db.routes.get("agent:main:telegram:dm:") is None
    assert model.requests == []


async def test_new_with_a_name_titles_the_new_session(tmp_path, model):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        await api.say("u", "old topic")
        first = await gw.db.routes.get("agent:main:api:dm:u")
        started = await api.say("u", "/new Fresh start")
        second = await gw.db.routes.get("agent:main:api:dm:u")
        shown = await api.say("u", "/title")
        again = await api.say("u", "/new Fresh start")  # the title is taken (by this very session)
        third = await gw.db.routes.get("agent:main:api:dm:u")
        await api.close()
    assert started == f'Started a new session "Fresh start". The previous one ({first}) is saved: /resume {first} to go back.'
    assert shown == "Session title: Fresh start"
    assert again == (f'No new session started: The title "Fresh start" is already used by your session {second}. '
                     "Choose another.")
    assert first != second == third  # the refused /new changed nothing


@pytest.fixture
def info_log():
    """The gateway's logging at INFO into a string; restores the logging set-up afterwards."""
    root = logging.getLogger()
    saved = root.level, root.handlers[:], {name: logging.getLogger(name).level for name in ("httpx", "httpcore", "httpx2")}
    out = io.StringIO()
    setup_logging("INFO", "text", stream=out)
    root.handlers[:] = [h for h in root.handlers if type(h).__module__ == "gateway.logging_setup"]
    yield out
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


async def test_a_model_call_logs_nothing_at_info_and_a_failure_warns(tmp_path, model, info_log):
    async with running_gateway(tmp_path, model) as gw:
        api = ApiClient(gw)
        before = info_log.tell()
        await api.say("k", "hello")
        quiet = info_log.getvalue()[before:]
        model.script(Fail(401, message="Incorrect API key provided.", code="invalid_api_key"))
        assert (await api.failure("k", "again"))[0] == 502
        failed = info_log.getvalue()[before + len(quiet):]
        await api.close()
    assert quiet == ""
    assert [line.split(None, 3)[2:] for line in failed.splitlines()] == [
        ["WARNING", "gateway.router: turn for agent:main:api:dm:k failed: model unavailable (HTTP 401)"]]
