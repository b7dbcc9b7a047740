"""Signal beyond the conformance kit: a signal-cli restart survived, a failed handling delivered again,
groups' mentions and quotes, approvals by a 👍, voice notes, quoted replies, the account check and
doctor, each against tests/fakes/signal_cli.py (the kit, tests/test_platform_kit.py, runs the whole
gateway against it too).

    .venv/bin/python -m pytest -q -n 0 tests/test_signal.py
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest

from adapters.signal import SignalAdapter, SignalConfig
from gateway.errors import AdapterError
from gateway.types import ChatRef, InboundMessage
from tests.adapter_config import configured
from tests.fakes.signal_cli import FakeSignalCli
from tests.waiting import eventually

ANN, BOB = "+4915100000001", "+4915100000002"
GROUP = "Z3JvdXAtaWQtZm9yLXRlc3Rz"


@asynccontextmanager
async def running(sc: FakeSignalCli, handler=None, **kw):
    got: list[InboundMessage] = []

    async def keep(message: InboundMessage) -> None:
        got.append(message)

    adapter = configured(SignalAdapter, SignalConfig, account=sc.account, http_url=sc.url, **kw)
    await adapter.start(handler or keep)
    try:
        yield adapter, got
    finally:
        await adapter.stop()


async def test_a_signal_cli_restart_is_survived_and_what_it_received_meanwhile_arrives():
    async with FakeSignalCli() as sc, running(sc) as (adapter, got):
        sc.dm(ANN, "before")
        await eventually(lambda: [m.text for m in got] == ["before"], 5, "the first message")
        sc.go_down()
        await eventually(lambda: adapter.health().state == "reconnecting", 5, "the cut seen")
        sc.dm(ANN, "while it restarted")  # what the new signal-cli process received before we reconnected
        sc.come_back()
        await eventually(lambda: "while it restarted" in [m.text for m in got], 15, "the message after the restart")
        resumed = sc.stream_requests[-1].get("Last-Event-ID")
        state = adapter.health().state
    assert resumed == "0-1" and state == "connected"  # asked from the last event stored
    # the new process did not know that id, so it sent all it keeps: "before" again (the store keeps it once)
    assert [m.text for m in got] == ["before", "before", "while it restarted"]
    assert len({m.message_id for m in got}) == 2


async def test_an_event_the_gateway_failed_on_comes_again():
    seen: list[str] = []

    async def flaky(message: InboundMessage) -> None:
        seen.append(message.text)
        if len(seen) == 1:
            raise RuntimeError("the store is busy")

    async with FakeSignalCli() as sc, running(sc, flaky):
        sc.dm(ANN, "keep me")
        sc.dm(ANN, "and me")
        await eventually(lambda: seen[-1:] == ["and me"], 10, "both handled")
    assert seen == ["keep me", "keep me", "and me"]


async def test_in_a_group_only_a_mention_a_quote_of_ours_or_a_command_is_addressed():
    async with FakeSignalCli() as sc, running(sc) as (adapter, got):
        sc.in_group(GROUP, ANN, "just chatting")
        sc.in_group(GROUP, ANN, "what time is it?", mention=True)
        sc.in_group(GROUP, BOB, "/status")
        await eventually(lambda: len(got) == 3, 5, "three group messages")
        sent = await adapter.send(ChatRef("signal", f"group.{GROUP}"), "noon", reply_to=got[1].message_id)
        [ours] = sent.message_ids
        stamp = int(ours.split(":")[0])
        sc.emit(sc.envelope(BOB, {"message": "thanks", "groupInfo": {"groupId": GROUP},
                                  "quote": {"id": stamp, "author": sc.account, "authorNumber": sc.account}}))
        await eventually(lambda: len(got) == 4, 5, "the quote")
    assert [(m.text, m.addressed, m.chat_id) for m in got] == [
        ("just chatting", False, f"group.{GROUP}"), ("what time is it?", True, f"group.{GROUP}"),
        ("/status", True, f"group.{GROUP}"), ("thanks", True, f"group.{GROUP}")]
    [reply] = sc.sent
    assert (reply["groupId"], reply["quoteAuthor"], reply["quoteTimestamp"]) == (
        GROUP, ANN, int(got[1].message_id.split(":")[0]))


async def test_a_thumbs_up_on_an_approval_request_approves_it():
    async with FakeSignalCli() as sc, running(sc) as (adapter, got):
        chat = ChatRef("signal", ANN)
        request = await adapter.send(chat, "ledger__append wants to run. Reply /approve 3f9a1c07 or /deny 3f9a1c07")
        other = await adapter.send(chat, "just an answer")
        for target, emoji in ((other.message_ids[0], "👍"), (request.message_ids[0], "🎉"),
                              (request.message_ids[0], "👍")):
            stamp, author = target.split(":")
            sc.emit(sc.envelope(ANN, {"reaction": {"emoji": emoji, "targetAuthor": author,
                                                   "targetAuthorNumber": author, "targetSentTimestamp": int(stamp),
                                                   "isRemove": False}}))
        sc.dm(ANN, "marker")
        await eventually(lambda: got and got[-1].text == "marker", 5, "the marker")
        async def typing_shown() -> bool:  # typing only takes a free slot of the chat's budget, never queues
            await adapter.send_typing(chat)
            return bool(sc.typing)

        await eventually(typing_shown, 5, "the typing indicator", every=0.1)
        reacted = await adapter.react(chat, got[-1].message_id, "👀")
    assert [(m.text, m.user_id) for m in got] == [("/approve 3f9a1c07", ANN), ("marker", ANN)]
    assert sc.typing == [dict(recipient=[ANN], at=sc.typing[0]["at"])]
    assert reacted.ok and sc.reactions[0]["emoji"] == "👀" and sc.reactions[0]["targetAuthor"] == ANN


async def test_a_voice_note_is_fetched_into_the_message():
    async with FakeSignalCli() as sc, running(sc) as (_, got):
        item = sc.add_attachment(b"\x00\x00\x00\x18ftypM4A voice", content_type="audio/aac", filename=None, voice=True)
        sc.emit(sc.envelope(ANN, {"message": "", "attachments": [item]}))
        await eventually(lambda: got, 5, "the voice note")
    [(voice,)] = [m.attachments for m in got]
    assert (voice.kind, voice.name, voice.data) == ("audio", "voice.m4a", b"\x00\x00\x00\x18ftypM4A voice")


async def test_a_rate_limit_is_waited_out_and_a_refused_send_says_why():
    async with FakeSignalCli() as sc, running(sc) as (adapter, _):
        sc.fail_next(1, retry_after=1.0)
        ok = await adapter.send(ChatRef("signal", ANN), "through the limit")
        refused = await adapter.send(ChatRef("signal", "group.unknown"), "to nowhere")
    assert ok.ok and sc.texts_in(ANN) == ["through the limit"]
    times = [c.at for c in sc.calls if c.method == "send"]
    assert times[1] - times[0] >= 0.9
    assert not refused.ok and "Invalid group id" in refused.error


async def test_start_refuses_an_account_signal_cli_does_not_have_and_a_daemon_that_is_not_there():
    async with FakeSignalCli() as sc:
        with pytest.raises(AdapterError, match=r"\+15559999999 is not registered or linked in this signal-cli"):
            await SignalAdapter(SignalConfig(account="+15559999999", http_url=sc.url)).start(lambda m: None)  # type: ignore[arg-type]
        url = sc.url
    with pytest.raises(AdapterError, match="signal-cli does not answer at .* daemon --http"):
        await SignalAdapter(SignalConfig(account="+15550001111", http_url=url)).start(lambda m: None)  # type: ignore[arg-type]


async def test_doctor_checks_the_daemon_and_the_account(tmp_path):
    from tests.fakes.model_server import FakeModel
    from tests.test_doctor import doctor, line, write_config

    async with FakeModel(model_name="fake-model") as model, FakeSignalCli() as sc:
        def config(account: str):
            return write_config(tmp_path, model={"base_url": model.base_url, "name": "fake-model"},
                                platforms={"signal": {"account": account, "http_url": sc.url}})
        _, ok = await doctor(config(sc.account))
        _, other = await doctor(config("+15559999999"))
        sc.go_down()
        _, down = await doctor(config(sc.account))
    assert line(ok, "signal") == f"✓ signal: signal-cli answers; {sc.account} is registered", ok
    assert line(other, "signal").startswith("✗ signal: +15559999999 is not an account of this signal-cli"), other
    assert line(down, "signal").startswith(f"✗ signal: signal-cli answered HTTP 503 at {sc.url}"), down
