"""Approval buttons on the platforms, pressed through the fake servers by the real client libraries:
Telegram inline keyboards (callback_query, answerCallbackQuery), Discord components (interactions) and
Slack Block Kit actions (block_actions).  A press is the presser's ``/approve <id>``: only the person who
asked (or an approver) can answer; the call is a real SDK server's (tests/mcp_servers/ledger_server.py),
which appends a line per run, so each test counts the runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gateway.runtime.daemon import Gateway
from tests.fakes.model_server import FakeModel, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, gateway_config

pytestmark = [pytest.mark.processes, pytest.mark.slow]

LEDGER = str(Path(__file__).resolve().parent / "mcp_servers" / "ledger_server.py")
ANN = FakeTelegram.user(111, "Ann")
BOB = FakeTelegram.user(222, "Bob")
EVE = FakeTelegram.user(666, "Eve")
TEAM = FakeTelegram.group_chat(-1001234567890, "Team")


def tools(**extra) -> dict:
    return {"mcp_servers": {"ledger": {"command": sys.executable, "args": [LEDGER], "allow": ["ledger__*"],
                                       "env": {"PYTHONCOERCECLOCALE": "0"}, "approval": "always"}}, **extra}


def _deliveries(db_path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return [row[0] for row in conn.execute("SELECT status FROM deliveries ORDER BY created_at")]


def lines(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


async def _ready(gw: Gateway) -> None:
    server = gw.mcp.servers["ledger"]
    await eventually(lambda: server.available, 20, lambda: f"ledger ready ({server.state}: {server.last_error})")


async def test_telegram_inline_buttons_approve_and_a_strangers_press_changes_nothing(tmp_path):
    target = tmp_path / "ledger.txt"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "ship it", "path": str(target)}), Reply("shipped"))
        config = gateway_config(tmp_path / "home", model.base_url, tools=tools(),
                                auth={"allowed_users": ["telegram:111", "telegram:222"]},
                                streaming={"enabled": False},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            tg.in_group(TEAM, ANN, "@switchboard_bot ship it please")
            [request] = await tg.wait_for_sent(1, timeout=15)
            assert "ledger__append" in request.visible_text and '"text": "ship it"' in request.visible_text
            approve, deny = request.button_data()
            assert approve.startswith("/approve ") and deny.startswith("/deny ")
            rid = approve.split()[1]

            tg.press(request, EVE, approve, chat=TEAM)  # not even allowed to talk to the bot: refused silently
            tg.press(request, BOB, approve, chat=TEAM)  # in the chat, but not the one who asked
            [_, refused] = await tg.wait_for_sent(2, timeout=10)
            assert len(tg.sent) == 2  # Eve's press (handled before Bob's) changed nothing and said nothing
            assert refused.visible_text == (f"Only the person who asked, or an approver, can answer request {rid} "
                                            "(ledger__append); nothing changed.")
            assert lines(target) == [] and (await gw.db.approvals.get(rid))["status"] == "pending"

            tg.press(request, ANN, approve, chat=TEAM)
            sent = await tg.wait_for_sent(4, timeout=15)
            assert [s.visible_text for s in sent[2:]] == [f"Approved: running ledger__append (request {rid}).",
                                                         "shipped"]
            assert lines(target) == ["ship it"]
            tg.press(request, ANN, approve, chat=TEAM)  # pressed again: answered already, not run again
            sent = await tg.wait_for_sent(5, timeout=10)
            assert sent[4].visible_text.endswith("was already answered: approved and run.")
            assert lines(target) == ["ship it"]
            # every press was answered (the client's spinner stops), once each
            assert len(tg.calls("answerCallbackQuery")) == 4 and all(tg.queries.values())
        finally:
            await gw.stop(grace_seconds=5)


def _names_it_all(text: str, rid: str) -> None:
    """The request names the tool, the request and what each button does, in the message with the buttons."""
    assert text.startswith(f"Approval needed: ledger__append wants to run with these arguments (request {rid}):")
    assert ("Approve runs exactly this call, once; Deny refuses it and the model is told "
            f"(or send /approve {rid} or /deny {rid}). Unanswered, it is denied in") in text


async def test_a_streamed_reply_ends_in_the_request_with_its_buttons_in_the_same_message(tmp_path):
    """Streaming on (Telegram's default): the streamed message becomes the request, buttons and all."""
    target = tmp_path / "ledger.txt"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "streamed", "path": str(target)}, content="Let me note it."),
                     Reply("noted"))
        config = gateway_config(tmp_path / "home", model.base_url, tools=tools(),
                                auth={"allowed_users": ["telegram:111"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            tg.dm(ANN, "note it")
            await tg.wait_for(lambda: any(s.button_data() for s in tg.sent), 15, "the buttons")
            [request] = tg.sent  # one message: the streamed one, edited into the request with its buttons
            approve, deny = request.button_data()
            rid = approve.split()[1]
            assert (approve, deny) == (f"/approve {rid}", f"/deny {rid}") and request.edits >= 1
            _names_it_all(request.visible_text, rid)
            tg.press(request, ANN, approve)
            await tg.wait_for(lambda: tg.sent[-1].visible_text == "noted", 15, "the continued answer")
            assert [s.visible_text for s in tg.sent[1:]] == [f"Approved: running ledger__append (request {rid}).",
                                                            "noted"]
        finally:
            await gw.stop(grace_seconds=5)
    assert lines(target) == ["streamed"]

async def test_a_configured_approver_answers_for_someone_else_with_the_deny_button(tmp_path):
    target = tmp_path / "ledger.txt"
    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "drop tables", "path": str(target)}), Reply("not done"))
        config = gateway_config(tmp_path / "home", model.base_url, tools=tools(approvers=["ops"]),
                                identities={"ops": ["telegram:222"]}, streaming={"enabled": False},
                                auth={"allowed_users": ["telegram:111", "telegram:222"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            tg.in_group(TEAM, ANN, "@switchboard_bot drop the tables")
            [request] = await tg.wait_for_sent(1, timeout=15)
            deny = request.button_data()[1]
            tg.press(request, BOB, deny, chat=TEAM)  # Bob is an approver (identity "ops")
            sent = await tg.wait_for_sent(3, timeout=15)
            assert [s.visible_text for s in sent[1:]] == [
                f"Denied: ledger__append was not run (request {deny.split()[1]}).", "not done"]
            row = await gw.db.approvals.get(deny.split()[1])
        finally:
            await gw.stop(grace_seconds=5)
    assert lines(target) == [] and (row["status"], row["decided_by"]) == ("denied", "telegram:222")
    [result] = [m["content"] for m in model.requests[-1].messages if m["role"] == "tool"]
    assert result.startswith("error: the user denied this call to ledger__append")

async def test_discord_buttons_approve_a_call_in_a_channel_and_another_members_press_is_refused(tmp_path):
    from adapters.discord import DiscordAdapter
    from gateway.config import Config
    from tests.fakes.discord import FakeDiscord, visible_text

    target = tmp_path / "ledger.txt"
    async with FakeDiscord() as dc, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "deploy", "path": str(target)}), Reply("deployed"))
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test"},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}", f"discord:{dc.bob['id']}"]},
            "platforms": {"discord": {"token": dc.token, "api_base_url": dc.api_base_url,
                                      "gateway_url": dc.gateway_url, "stall_timeout_seconds": 30},
                          "telegram": {"enabled": False}, "slack": {"enabled": False}},
            "streaming": {"enabled": False}, "tools": tools(), "shutdown": {"grace_seconds": 2},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=[], vision=False)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            await dc.channel_message(dc.general, dc.alice, f"{dc.mention(dc.bot)} deploy please", mentions=(dc.bot,))
            [request] = await dc.wait_for_sent(1, timeout=15)
            shown = visible_text(request["content"])
            assert "ledger__append" in shown and '"text": "deploy"' in shown
            approve, deny = dc.button_ids(request)
            assert approve.startswith("/approve ") and deny.startswith("/deny ")

            await dc.press_button(request, dc.bob, approve, channel=dc.general)
            [_, refused] = await dc.wait_for_sent(2, timeout=10)
            assert visible_text(refused["content"]).startswith("Only the person who asked, or an approver, can answer request")
            assert lines(target) == []

            await dc.press_button(request, dc.alice, approve, channel=dc.general)
            sent = await dc.wait_for_sent(4, timeout=15)
            assert visible_text(sent[2]["content"]).startswith("Approved: running ledger__append")
            assert sent[3]["content"] == "deployed"
            assert lines(target) == ["deploy"]
            # each press was acknowledged within Discord's 3 s as an update of the message (type 6)
            assert [c.get("type") for c in dc.interaction_callbacks] == [6, 6]
        finally:
            await gw.stop()


async def test_slack_block_kit_buttons_approve_over_socket_mode(tmp_path, monkeypatch):
    from tests.fakes.slack import FakeSlack

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    target = tmp_path / "ledger.txt"
    async with FakeSlack() as slack, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "invoice 7", "path": str(target)}), Reply("invoiced"))
        config = gateway_config(tmp_path / "home", model.base_url, tools=tools(),
                                auth={"allowed_users": ["slack:U1", "slack:U2"]}, streaming={"enabled": False},
                                platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                                     "api_base_url": slack.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()
            await slack.send_event(slack.message("D1", "U1", "send invoice 7"))
            [request] = await slack.wait_for_sent(1, timeout=15)
            section = request["blocks"][0]["text"]["text"]
            assert "ledger__append" in section and '"text": "invoice 7"' in section
            approve, deny = slack.button_values(request)
            assert approve.startswith("/approve ") and deny.startswith("/deny ")
            envelope = await slack.press(request, "U1", approve, channel_name="directmessage")
            await slack.wait_for_ack(envelope)
            sent = await slack.wait_for_sent(3, timeout=15)
            assert sent[1]["text"].startswith("Approved: running ledger") and sent[2]["text"] == "invoiced"
            assert lines(target) == ["invoice 7"]
            assert all(s["channel"] == "D1" for s in sent)
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_kill_9_between_the_request_and_the_answer_the_button_still_works_and_runs_the_call_once(tmp_path):
    """The real daemon (``switchboard run``) is killed with SIGKILL while a request waits; after the
    restart nothing has run, the button under the old message still answers it, and the call runs once."""
    from tests.crashkit import Daemon, TelegramSide

    target = tmp_path / "ledger.txt"

    def ledger_ready(run: int) -> bool:
        path = daemon.log_path(run)
        return path.exists() and "MCP server ledger is ready" in path.read_text(errors="replace")

    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "after the crash", "path": str(target)}),
                     Reply("done, once"))
        side = TelegramSide(tg)
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000"},
            "auth": {"allowed_users": ["telegram:111"]}, "streaming": {"enabled": False},
            "logging": {"level": "INFO", "format": "text"}, "shutdown": {"grace_seconds": 5},
            "tools": tools(), **side.settings()})
        start = await daemon.start()
        try:
            await side.ready(start, 30)
            await eventually(lambda: ledger_ready(0), 30, "the ledger server ready in the first run")
            tg.dm(ANN, "append after the crash")
            [request] = await tg.wait_for_sent(1, timeout=20)
            approve = request.button_data()[0]
            # killed once the request is recorded as sent (a kill before that may send it again, by design)
            await eventually(lambda: _deliveries(daemon.db_path) == ["sent"], 10, "the request recorded as sent")
            await daemon.kill()

            start = await daemon.start()
            await side.ready(start, 30)
            await eventually(lambda: ledger_ready(1), 30, "the ledger server ready after the restart")
            assert lines(target) == [] and len(model.requests) == 1  # nothing ran without its answer
            tg.press(request, ANN, approve)
            sent = await tg.wait_for_sent(3, timeout=30)
            assert [s.visible_text for s in sent[1:]] == [
                f"Approved: running ledger__append (request {approve.split()[1]}).", "done, once"]
            tg.press(request, ANN, approve)
            sent = await tg.wait_for_sent(4, timeout=20)
            assert sent[3].visible_text.endswith("was already answered: approved and run.")
            assert await daemon.stop() == 0
        finally:
            if daemon.proc is not None and daemon.proc.returncode is None:
                await daemon.kill()
    assert lines(target) == ["after the crash"], daemon.log_problems()
    # the request and the continued answer were each recorded before they were sent (crash-safe), and sent
    assert _deliveries(daemon.db_path) == ["sent", "sent"]


async def test_an_approved_call_cut_off_by_a_kill_9_is_never_run_again(tmp_path):
    """SIGKILL while the approved call runs: after the restart the call is not run again, its result says
    it was interrupted, and a second press is told so."""
    from tests.crashkit import Daemon, TelegramSide

    target = tmp_path / "ledger.txt"

    def ledger_ready(run: int) -> bool:
        path = daemon.log_path(run)
        return path.exists() and "MCP server ledger is ready" in path.read_text(errors="replace")

    async with FakeTelegram() as tg, FakeModel() as model:
        model.script(ToolCall("ledger__append_slowly", {"text": "half", "path": str(target), "seconds": 20}))
        side = TelegramSide(tg)
        daemon = Daemon(tmp_path, {
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test-not-a-secret-0000"},
            "auth": {"allowed_users": ["telegram:111"]}, "streaming": {"enabled": False},
            "logging": {"level": "INFO", "format": "text"}, "shutdown": {"grace_seconds": 5},
            "tools": tools(), **side.settings()})
        start = await daemon.start()
        try:
            await side.ready(start, 30)
            await eventually(lambda: ledger_ready(0), 30, "the ledger server ready")
            tg.dm(ANN, "append half")
            [request] = await tg.wait_for_sent(1, timeout=20)
            approve = request.button_data()[0]
            tg.press(request, ANN, approve)
            await eventually(lambda: lines(target) == ["half"], 20, "the approved call running")
            await daemon.kill()

            start = await daemon.start()
            await side.ready(start, 30)
            tg.press(request, ANN, approve)
            sent = await tg.wait_for_sent(3, timeout=20)
            assert sent[2].visible_text.endswith("was already answered: approved, and cut off by a restart.")
            assert await daemon.stop() == 0
        finally:
            if daemon.proc is not None and daemon.proc.returncode is None:
                await daemon.kill()
        import state

        with state.SessionDB(daemon.db_path) as db:
            row = db.approvals.get(approve.split()[1])
            tool_rows = [m for m in db.messages.get(row["session_id"]) if m.role == "tool"]
    assert row["status"] == "interrupted" and lines(target) == ["half"]
    assert [m.content for m in tool_rows] == [
        "error: this call to ledger__append_slowly was approved, but the gateway stopped before its result came "
        "back; it may or may not have taken effect and it was not run again. Check before calling it again."]
    assert len(model.requests) == 1  # nobody asked the model to go on by itself


async def test_discord_a_streamed_request_carries_its_buttons_in_the_same_message(tmp_path):
    from adapters.discord import DiscordAdapter
    from gateway.config import Config
    from tests.fakes.discord import FakeDiscord, visible_text

    target = tmp_path / "ledger.txt"
    async with FakeDiscord() as dc, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "streamed", "path": str(target)}, content="Let me note it."),
                     Reply("noted"))
        config = Config.model_validate({
            "home": str(tmp_path / "home"),
            "model": {"base_url": model.base_url, "name": "fake-model", "api_key": "sk-test"},
            "auth": {"allowed_users": [f"discord:{dc.alice['id']}"]},
            "platforms": {"discord": {"token": dc.token, "api_base_url": dc.api_base_url,
                                      "gateway_url": dc.gateway_url, "stall_timeout_seconds": 30},
                          "telegram": {"enabled": False}, "slack": {"enabled": False}},
            "streaming": {"enabled": True}, "tools": tools(), "shutdown": {"grace_seconds": 2},
        })
        adapter = DiscordAdapter.from_config(config.platforms.discord, commands=[], vision=False)
        gw = Gateway(config, adapters={"discord": adapter}, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            await dc.dm(dc.alice, "note it")
            await dc.wait_until(lambda: any(dc.button_ids(m) for m in dc.sent()), 15, "the buttons")
            [request] = dc.sent()
            approve, deny = dc.button_ids(request)
            rid = approve.split()[1]
            assert deny == f"/deny {rid}"
            _names_it_all(visible_text(request["content"]), rid)
            await dc.press_button(request, dc.alice, approve)
            await dc.wait_until(lambda: dc.sent()[-1]["content"] == "noted", 15, "the continued answer")
        finally:
            await gw.stop()
    assert lines(target) == ["streamed"]


async def test_slack_a_streamed_request_carries_its_buttons_in_the_same_message(tmp_path, monkeypatch):
    from tests.fakes.slack import FakeSlack

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    target = tmp_path / "ledger.txt"
    async with FakeSlack() as slack, FakeModel() as model:
        model.script(ToolCall("ledger__append", {"text": "streamed", "path": str(target)}, content="Let me note it."),
                     Reply("noted"))
        config = gateway_config(tmp_path / "home", model.base_url, tools=tools(),
                                auth={"allowed_users": ["slack:U1"]}, streaming={"enabled": True},
                                platforms={"slack": {"bot_token": slack.bot_token, "app_token": slack.app_token,
                                                     "api_base_url": slack.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await _ready(gw)
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", 10)
            await slack.wait_connected()
            await slack.send_event(slack.message("D1", "U1", "note it"))
            await eventually(lambda: any(slack.button_values(m) for m in slack.sent), 15, "the buttons")
            [request] = slack.sent
            approve, deny = slack.button_values(request)
            rid = approve.split()[1]
            assert deny == f"/deny {rid}"
            section = request["blocks"][0]["text"]["text"]
            assert section.startswith(f"Approval needed: *ledger__append* wants to run with these arguments "
                                      f"(request {rid}):")
            assert "*Approve* runs exactly this call, once; *Deny* refuses it" in section
            envelope = await slack.press(request, "U1", approve, channel_name="directmessage")
            await slack.wait_for_ack(envelope)
            await eventually(lambda: slack.sent[-1].get("text") == "noted", 15, "the continued answer")
        finally:
            await gw.stop(grace_seconds=5)
    assert lines(target) == ["streamed"]
