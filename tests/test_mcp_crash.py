"""A tool call cut off by a kill -9 is never run again: the restarted daemon tells the model the call
was interrupted, as that call's tool message, and lets it ask again.  The real daemon as a subprocess
(tests/crashkit.py), the real echo server over stdio, the fake Telegram and the fake model."""

from __future__ import annotations

import sys

import pytest

import state
from gateway.turn_journal import INTERRUPTED
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually
from tests.test_mcp_tools import ECHO, NO_COERCION

pytestmark = [pytest.mark.processes, pytest.mark.slow]

ANN = FakeTelegram.user(111, "Ann")


async def test_a_call_cut_off_by_a_kill_is_not_run_again_and_the_model_is_told(tmp_path):
    calls = tmp_path / "calls.log"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("echo__slow", {"seconds": 120}),
                     ToolCall("echo__echo", {"text": "still here"}), Reply("The slow job was cut off; ask me again."))
        settings = {**TelegramSide(tg).settings(), "model": {"base_url": model.base_url, "name": "fake-model"},
                    "auth": {"allowed_users": ["telegram:111"]}, "logging": {"format": "text"},
                    "tools": {"mcp_servers": {"echo": {
                        "command": sys.executable, "args": [ECHO], "allow": ["echo__*"],
                        "env": {**NO_COERCION, "CALL_LOG": str(calls)}}}}}
        daemon = Daemon(tmp_path, settings)
        side = TelegramSide(tg)
        await side.ready(await daemon.start(), 30)
        try:
            await eventually(lambda: "MCP server echo is ready" in daemon.log_path(0).read_text(), 30,
                             "the echo server ready")
            tg.dm(ANN, "run the slow job")
            await eventually(lambda: calls.exists() and calls.read_text(), 30, "the slow call running in the server")
            await daemon.kill()
            tg.dm(ANN, "are you still there?")  # written while no daemon ran: answered with the resumed turn
            await side.ready(await daemon.start(), 30)
            final = "The slow job was cut off; ask me again."
            await eventually(lambda: [m for m in tg.sent if final in m.visible_text], 60, "the resumed turn's answer")
        finally:
            await daemon.stop()
    assert calls.read_text().count("started") == 1  # run once, never again by the restart
    resumed = model.requests[1]  # the first request of the restarted daemon
    assert [m["role"] for m in resumed.messages[-3:]] == ["user", "assistant", "tool"]
    assert resumed.messages[-2]["tool_calls"][0]["function"]["name"] == "echo__slow"
    assert resumed.messages[-1]["content"] == INTERRUPTED
    assert [t["function"]["name"] for t in resumed.body["tools"]].count("echo__slow") == 1  # it may ask again
    with state.SessionDB(daemon.db_path) as db:
        [(_, session_id)] = db.routes.list()
        messages = db.messages.get(session_id)
        stored = [(m.role, m.content) for m in messages if m.role == "tool"]
        journal = db.tool_journal.newest([m.id for m in messages if m.role == "user"])
    assert stored == [("tool", INTERRUPTED), ("tool", "echo: still here")]  # the session shows what happened
    assert journal is None  # the stored turn took its journal with it


def _asked(tg: FakeTelegram, text: str):
    asked = [s for s in tg.sent if "(question " in s.visible_text and text in s.visible_text]
    return asked[-1] if asked else None


async def test_a_question_pending_at_a_kill_is_answered_after_the_restart_and_the_call_goes_on(tmp_path):
    """2026-07-28: the server's question is of a retried request; after kill -9 the restarted daemon's
    resumed turn takes the answer to the question already in the chat, sends the call again with it,
    and the model's answer reaches the chat as the turn's would have.  The tool ran once."""
    calls = tmp_path / "calls.log"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("echo__book", {}), Reply("Booked: Rome."))
        settings = {**TelegramSide(tg).settings(), "model": {"base_url": model.base_url, "name": "fake-model"},
                    "auth": {"allowed_users": ["telegram:111"]}, "logging": {"format": "text"},
                    "streaming": {"enabled": False},
                    "tools": {"mcp_servers": {"echo": {
                        "command": sys.executable, "args": [ECHO], "allow": ["echo__*"],
                        "env": {**NO_COERCION, "CALL_LOG": str(calls), "REQUEST_STATE_KEY": "s" * 32}}}}}
        daemon = Daemon(tmp_path, settings)
        side = TelegramSide(tg)
        await side.ready(await daemon.start(), 30)
        try:
            await eventually(lambda: "MCP server echo is ready" in daemon.log_path(0).read_text(), 30,
                             "the echo server ready")
            tg.dm(ANN, "book me a trip")
            city = await tg.wait_for(lambda: _asked(tg, "City: Where to"), 30, "the question asked")
            qid = city.visible_text.split("(question ")[1].split(")")[0]
            await daemon.kill()
            await side.ready(await daemon.start(), 30)
            _, rome, _, _ = city.button_data()
            tg.press(city, ANN, rome)
            confirm = await tg.wait_for(lambda: _asked(tg, "Confirm: Book it now?"), 60,
                                        lambda: f"the next field ({[m.visible_text for m in tg.sent]})")
            tg.press(confirm, ANN, confirm.button_data()[0])  # Yes
            note = await tg.wait_for(lambda: _asked(tg, "Note: Anything"), 30, "the last field")
            tg.press(note, ANN, note.button_data()[0])  # Skip
            await eventually(lambda: [m for m in tg.sent if "Booked: Rome." in m.visible_text], 60,
                             lambda: f"the resumed turn's answer ({[m.visible_text for m in tg.sent]})")
        finally:
            await daemon.stop()
    assert calls.read_text().count("book ") == 1
    assert not [m for m in tg.sent if "was cut off" in m.visible_text]
    with state.SessionDB(daemon.db_path) as db:
        [(_, session_id)] = db.routes.list()
        stored = [m.content for m in db.messages.get(session_id) if m.role == "tool"]
        question = db.questions.get(qid)
    assert stored == ["booked Rome (note: none)"]
    assert question is not None and question["status"] == "answered" and question["resent_at"] is not None
