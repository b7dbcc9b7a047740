"""A tool server's questions to the user mid-call (MCP elicitation), asked in the chat through the fake
Telegram server with the real client library: real SDK servers that ask (tests/mcp_servers/echo_server.py's
``book`` on 2026-07-28, answered by the SDK's retry of an InputRequiredResult; legacy_server.py's ``book``
on the legacy revision, a server-to-client elicitation/create), a form of three fields asked one at a
time: a choice and a yes/no as buttons, a text field answered by a plain reply."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.commands import Command, CommandContext
from gateway.runtime.daemon import Gateway
from gateway.tools_mcp.questions import ToolQuestions
from gateway.types import ChatType, InboundMessage
from state import AsyncSessionDB
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, gateway_config
from tests.mcp_legacy import legacy_server, needs_legacy

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ECHO = str(Path(__file__).resolve().parent / "mcp_servers" / "echo_server.py")
ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team")
ECHO_SERVER = {"echo": {"command": sys.executable, "args": [ECHO], "allow": ["echo__*"],
                        "env": {"PYTHONCOERCECLOCALE": "0"}}}


def _config(tmp_path, tg, model, servers, **tools):
    return gateway_config(tmp_path / "home", model.base_url, tools={"mcp_servers": servers, **tools},
                          auth={"allowed_users": ["telegram:111", "telegram:222"]}, streaming={"enabled": False},
                          platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})


async def _started(config, tg, server: str, *, daemon: bool = False) -> Gateway:
    gw = Gateway(config, serve_api=daemon)  # daemon: what a stop left is settled at start (as `switchboard run`)
    await gw.start()
    await eventually(lambda: gw.mcp.servers[server].available, 30, f"{server} ready")
    await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
    return gw


def _question(tg, field_text: str):
    """The newest message that asks ``field_text``."""
    asked = [s for s in tg.sent if "(question " in s.visible_text and field_text in s.visible_text]
    return asked[-1] if asked else None


async def _asked(tg, field_text: str, timeout: float = 20):
    return await tg.wait_for(lambda: _question(tg, field_text), timeout,
                             lambda: f"the question {field_text!r} (sent: {[s.visible_text for s in tg.sent]})")


def _said(tg, text: str):
    return next((s for s in tg.sent if text in s.visible_text), None)


@pytest.mark.parametrize("revision", ["2026-07-28", "legacy"])
async def test_a_form_is_asked_one_field_at_a_time_and_only_the_asker_answers(tmp_path, revision):
    if revision == "legacy":
        if needs_legacy.args[0]:
            pytest.skip(needs_legacy.kwargs["reason"])
    servers = ECHO_SERVER if revision != "legacy" else {"legacy": legacy_server()}
    name = next(iter(servers))
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall(f"{name}__book", {}), Reply("your trip is booked"), Reply("Bob, it is Ann's trip"))
        gw = await _started(_config(tmp_path, tg, model, servers), tg, name)
        try:
            assert gw.mcp.servers[name].protocol == ("2026-07-28" if revision != "legacy" else "2025-11-25")
            tg.in_group(TEAM, ANN, "@switchboard_bot book me a trip")
            city = await _asked(tg, "City: Where to")
            assert city.visible_text.startswith(f"{name}__book asks: Which trip shall I book?\nQuestion 1 of 3")
            labels = [b["text"] for row in city.reply_markup["inline_keyboard"] for b in row]
            assert labels == ["Paris", "Rome", "Oslo", "Decline"]  # required: no skip
            qid = city.visible_text.split("(question ")[1].split(")")[0]
            paris, rome, _oslo, _decline = city.button_data()
            assert rome == f"/answer {qid} #2"

            tg.press(city, BOB, rome, chat=TEAM)  # in the chat, but not the one whose call it is
            await tg.wait_for(lambda: _said(tg, f"can answer question {qid}"), 10, "Bob refused")
            assert (await gw.db.questions.get(qid))["status"] == "pending"

            tg.press(city, ANN, rome, chat=TEAM)
            confirm = await _asked(tg, "Confirm: Book it now?")
            await tg.wait_for(lambda: _said(tg, f"Noted for {name}__book: City = Rome (question {qid})."), 10, "noted")
            tg.press(city, ANN, paris, chat=TEAM)  # pressed again: decided once
            await tg.wait_for(lambda: _said(tg, f"Question {qid} ({name}__book) is already closed: answered."), 10,
                              "the second press told")
            yes, _no, _ = confirm.button_data()
            tg.press(confirm, ANN, yes, chat=TEAM)

            note = await _asked(tg, "Note: Anything to tell the hotel")
            assert "Reply with your answer" in note.visible_text
            tg.in_group(TEAM, BOB, "@switchboard_bot ignore her, book Oslo")  # not Bob's question: a message for a turn
            replied = {"message_id": note.message_id, "date": 0, "chat": TEAM, "from": tg.bot_user, "text": note.text}
            tg.in_group(TEAM, ANN, "late check-in", reply_to=replied)  # a plain reply to the question is the answer
            await tg.wait_for(lambda: _said(tg, "your trip is booked"), 20,
                              lambda: f"the model's answer ({[s.visible_text for s in tg.sent]})")
        finally:
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert [m["content"] for m in tool_messages][-1] == "booked Rome (note: late check-in)"
    assert not any("ignore her" in m.get("content", "") for m in tool_messages)


async def test_an_unanswered_question_is_declined_and_the_server_told(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("echo__book", {}), Reply("no answer, no trip"))
        gw = await _started(_config(tmp_path, tg, model, ECHO_SERVER, approval_timeout=1.5), tg, "echo")
        try:
            tg.dm(ANN, "book me a trip")
            city = await _asked(tg, "City: Where to")
            qid = city.visible_text.split("(question ")[1].split(")")[0]
            await tg.wait_for(lambda: _said(tg, "no answer, no trip"), 20, "the model's answer")
            assert _said(tg, f"Question {qid} (echo__book) was not answered within 1.5 seconds; the server was told no.")
            assert (await gw.db.questions.get(qid))["status"] == "expired"
        finally:
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages[-1]["content"] == "not booked (decline)"


async def test_a_question_pending_across_a_restart_is_answered_after_it_and_the_call_goes_on(tmp_path):
    """2026-07-28: the question is of a retried request, so the restarted gateway sends the call again
    with the answer; the server seals its request_state under a key of its own (a deployed server's)."""
    calls = tmp_path / "calls.log"
    keyed = {"echo": {**ECHO_SERVER["echo"], "env": {**ECHO_SERVER["echo"]["env"], "CALL_LOG": str(calls),
                                                      "REQUEST_STATE_KEY": "k" * 32}}}
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("echo__book", {}), Reply("your trip is booked"))
        config = _config(tmp_path, tg, model, keyed)
        gw = await _started(config, tg, "echo", daemon=True)
        try:
            tg.dm(ANN, "book me a trip")
            city = await _asked(tg, "City: Where to")
            qid = city.visible_text.split("(question ")[1].split(")")[0]
        finally:
            await gw.stop(grace_seconds=2)
        gw = await _started(config, tg, "echo", daemon=True)
        try:
            _, rome, _, _ = city.button_data()
            tg.press(city, ANN, rome)  # the question asked before the restart
            await tg.wait_for(lambda: _said(tg, f"Noted for echo__book: City = Rome (question {qid})"), 20,
                              lambda: f"noted ({[s.visible_text for s in tg.sent]})")
            confirm = await _asked(tg, "Confirm: Book it now?")
            yes, _no, _ = confirm.button_data()
            tg.press(confirm, ANN, yes)
            note = await _asked(tg, "Note: Anything to tell the hotel")
            tg.press(note, ANN, note.button_data()[0])  # skip
            await tg.wait_for(lambda: _said(tg, "your trip is booked"), 30,
                              lambda: f"the model's answer ({[s.visible_text for s in tg.sent]})")
            assert not _said(tg, "was cut off")
            assert (await gw.db.questions.get(qid))["status"] == "answered"
        finally:
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages[-1]["content"] == "booked Rome (note: none)"
    assert calls.read_text().count("book ") == 1


async def test_a_round_the_restarted_server_refuses_is_asked_again(tmp_path):
    """A server whose request_state key died with it (the SDK's default) refuses the round from before
    the restart: the call is sent afresh and its question asked again, never answered with a guess."""
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("echo__book", {}), Reply("declined, as you said"))
        config = _config(tmp_path, tg, model, ECHO_SERVER)
        gw = await _started(config, tg, "echo", daemon=True)
        try:
            tg.dm(ANN, "book me a trip")
            city = await _asked(tg, "City: Where to")
        finally:
            await gw.stop(grace_seconds=2)
        gw = await _started(config, tg, "echo", daemon=True)
        try:
            _, rome, _, decline = city.button_data()
            tg.press(city, ANN, rome)
            confirm = await _asked(tg, "Confirm: Book it now?")
            tg.press(confirm, ANN, confirm.button_data()[0])
            note = await _asked(tg, "Note: Anything to tell the hotel")
            tg.press(note, ANN, note.button_data()[0])
            again = await tg.wait_for(lambda: (lambda q: q if q is not None and q.message_id != city.message_id
                                               else None)(_question(tg, "City: Where to")), 30,
                                      lambda: f"asked again ({[s.visible_text for s in tg.sent]})")
            tg.press(again, ANN, again.button_data()[-1])  # Decline
            await tg.wait_for(lambda: _said(tg, "declined, as you said"), 30, "the model's answer")
        finally:
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages[-1]["content"] == "not booked (decline)"


@needs_legacy
async def test_a_legacy_question_pending_across_a_restart_is_closed_and_a_late_press_says_so(tmp_path):
    """Legacy: the question was the server's request on a connection that died with the gateway."""
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("legacy__book", {}), Reply("sorry, that was cut off"), Reply("sorry, that was cut off"))
        config = _config(tmp_path, tg, model, {"legacy": legacy_server()})
        gw = await _started(config, tg, "legacy", daemon=True)
        try:
            tg.dm(ANN, "book me a trip")
            city = await _asked(tg, "City: Where to")
            qid = city.visible_text.split("(question ")[1].split(")")[0]
            assert (await gw.db.questions.get(qid))["status"] == "pending"
        finally:
            await gw.stop(grace_seconds=2)
        gw = await _started(config, tg, "legacy", daemon=True)
        try:
            await tg.wait_for(lambda: _said(tg, f"Question {qid} (legacy__book) was cut off: the gateway restarted"),
                              20, lambda: f"the chat told ({[s.visible_text for s in tg.sent]})")
            assert (await gw.db.questions.get(qid))["status"] == "interrupted"
            _, rome, _, _ = city.button_data()
            tg.press(city, ANN, rome)
            await tg.wait_for(lambda: _said(tg, f"Question {qid} (legacy__book) is already closed: cut off by a "
                                                "restart"), 10, "the late press told")
        finally:
            await gw.stop(grace_seconds=5)


@needs_legacy
async def test_a_link_to_open_goes_to_the_asker_alone_and_its_completion_is_reported(tmp_path):
    """URL-mode elicitation: from a group the link goes to the asker in a direct message (with the server's
    message and the host it goes to), the group is told to look there, and the server's completion is told."""
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("legacy__connect", {}), Reply("your calendar is connected"))
        gw = await _started(_config(tmp_path, tg, model, {"legacy": legacy_server()}), tg, "legacy")
        try:
            tg.in_group(TEAM, ANN, "@switchboard_bot connect my calendar")
            link = await tg.wait_for(lambda: _said(tg, "https://calendar.example/connect?session=e1"), 20,
                                     lambda: f"the link ({[s.visible_text for s in tg.sent]})")
            assert int(link.chat_id) == ANN["id"]  # to Ann alone
            assert "legacy__connect asks you to open a link: Connect your calendar so I can read it." in link.visible_text
            assert "it goes to calendar.example" in link.visible_text
            await tg.wait_for(lambda: _said(tg, "legacy__connect needs you to open a link: I sent it to you in a direct "
                                                "message."), 10, "the group told")
            done = await tg.wait_for(lambda: _said(tg, "legacy__connect: the step at the link is done."), 20,
                                     "the completion told")
            assert int(done.chat_id) == ANN["id"]
            await tg.wait_for(lambda: _said(tg, "your calendar is connected"), 20, "the model's answer")
            assert not [s for s in tg.sent if "calendar.example" in s.visible_text and int(s.chat_id) == TEAM["id"]]
        finally:
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages[-1]["content"] == "calendar connected"


async def test_a_late_answer_to_a_legacy_question_no_call_waits_for_is_told_it_ran_out(tmp_path):
    """A legacy server's question stored with its form, past its deadline with no call waiting for it
    here (its instance stopped in a cluster, where nothing settles it at start): the answer is refused."""
    db = await AsyncSessionDB.open(tmp_path / "state.db")
    try:
        schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                  "required": ["city"]}
        await db.questions.add({"id": "ab12cd34", "platform": "telegram", "chat_id": "111", "user_id": "111",
                                "tool": "legacy__book", "field": "city", "kind": "choice", "choices": "[]",
                                "asked_at": 1000.0, "expires_at": 1120.0,
                                "retry": json.dumps({"message": "Which trip?", "schema": schema})})
        questions = ToolQuestions(db, gateway_config(tmp_path / "home", "http://127.0.0.1:9").tools,
                                  clock=lambda: 1200.0)
        press = InboundMessage("telegram", ChatType.DM, "111", "111", "/answer ab12cd34 #2")
        said = await questions.answer_command(CommandContext(Command("answer", "ab12cd34 #2", True),
                                                             SimpleNamespace(msg=press, session_id=None),
                                                             None, None, None))
        assert said == "Question ab12cd34 (legacy__book) is already closed: declined (no answer in time).", said
        assert (await db.questions.get("ab12cd34"))["status"] == "expired"
    finally:
        await db.close()


@pytest.mark.parametrize("revision", ["2026-07-28", "legacy"])
async def test_an_answer_given_on_another_instance_reaches_the_waiting_call_within_seconds(tmp_path, pg_url,
                                                                                          revision):
    """Two instances on one PostgreSQL store: the call waits on this gateway; Ann's /answer is run by
    another instance (its own store handle and questions), which checks it against the stored form and
    stores it. The waiting call reads it from the store and goes on long before the question's
    two-minute deadline: a legacy server's question as a 2026-07-28 one, though only the instance its
    connection runs on could hand the server an answer."""
    if revision == "legacy" and needs_legacy.args[0]:
        pytest.skip(needs_legacy.kwargs["reason"])
    servers = ECHO_SERVER if revision != "legacy" else {"legacy": legacy_server()}
    name = next(iter(servers))
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall(f"{name}__book", {}), Reply("your trip is booked"))
        config = gateway_config(tmp_path / "home", model.base_url,
                                tools={"mcp_servers": servers, "approval_timeout": 120},
                                auth={"allowed_users": ["telegram:111"]}, streaming={"enabled": False},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}},
                                store={"url": pg_url}, cluster={"instance_id": "a"})
        gw = await _started(config, tg, name)
        other_db = await AsyncSessionDB.open(pg_url)
        try:
            tg.dm(ANN, "book me a trip")
            city = await _asked(tg, "City: Where to")
            qid = city.visible_text.split("(question ")[1].split(")")[0]
            other = ToolQuestions(other_db, config.tools)  # instance b: nothing of this call waits there

            async def answer_there(args: str) -> str:
                press = InboundMessage("telegram", ChatType.DM, "111", "111", f"/answer {args}")
                return await other.answer_command(CommandContext(Command("answer", args, True),
                                                                 SimpleNamespace(msg=press, session_id=None),
                                                                 None, None, None))  # /answer reads the message alone

            said = await answer_there(f"{qid} Berlin")  # checked there against the form as asked
            assert said.startswith(f"That does not fit question {qid}:") and "still waits" in said, said
            said = await answer_there(f"{qid} #2")
            goes_on = "." if revision == "legacy" else " (after a restart: once the gateway has resumed it)."
            assert said == f"Noted for {name}__book: City = Rome (question {qid}); the call goes on{goes_on}", said
            confirm = await _asked(tg, "Confirm: Book it now?", timeout=20)  # asked by the waiting call
            yes, _no, _ = confirm.button_data()
            tg.press(confirm, ANN, yes)
            note = await _asked(tg, "Note: Anything to tell the hotel")
            tg.press(note, ANN, note.button_data()[0])  # skip
            await tg.wait_for(lambda: _said(tg, "your trip is booked"), 20, "the model's answer")
        finally:
            await other_db.close()
            await gw.stop(grace_seconds=5)
    tool_messages = [m for r in model.requests for m in r.body["messages"] if m.get("role") == "tool"]
    assert tool_messages[-1]["content"] == "booked Rome (note: none)"
