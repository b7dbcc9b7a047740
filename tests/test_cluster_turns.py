"""Any instance runs any session's turn, under a lease with a fencing token.

Real daemons (tests/crashkit.py's ``Daemon``) on one PostgreSQL store, a fake platform (Telegram
polling, the Discord gateway, Slack Socket Mode) and the fake model: one instance owns the
platform's connection and stores the DMs; whichever instance claims a session answers it, and
sends the reply itself through the platform's REST API.  An instance paused past its
lease (SIGSTOP) comes back to find the session answered by another, and stores and sends nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace

import psycopg
import pytest

from state import DeliveryRecord, Fence, Handback, SessionDB
from state.cluster import LeaseLost, claim_next, get_lease, release
from tests.clusterdaemons import health as _health, instance_dir as _dir, instance_settings, stored as _stored
from tests.crashkit import Daemon, DiscordSide, Outcome, Plan, SlackSide, TelegramSide, UserMessage
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel, Hang
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually

WHERE = {"session_key": "agent:main:telegram:dm:42", "platform": "telegram", "chat_id": "42", "chat_type": "dm",
         "user_id": "42"}


def _settings(url: str, instance: str, model_url: str, *, lease_seconds: float, slots: int, **extra) -> dict:
    settings = instance_settings(url, instance, model_url, cluster={"lease_seconds": lease_seconds}, **extra)
    settings["model"]["max_concurrent_calls"] = slots
    return settings


async def _stop_all(daemons) -> None:
    for daemon in daemons:
        if daemon.proc is not None and daemon.proc.returncode is None:
            daemon.proc.send_signal(18)  # SIGCONT: a paused one must be able to stop
            await daemon.kill()


# -- the store: the per-session inbox read, and a fenced write under a stale token -------------


def test_the_unanswered_messages_of_one_session_are_read_apart_from_the_others(store):
    store.sessions.create("s1", "telegram")
    store.sessions.create("s2", "telegram")
    one = store.messages.append_inbound("s1", "one", platform_message_id="1", inbox={**WHERE, "platform_message_id": "1"})
    store.messages.append_inbound("s2", "other", platform_message_id="2", inbox={**WHERE, "platform_message_id": "2"})
    two = store.messages.append_inbound("s1", "two", platform_message_id="3", inbox={**WHERE, "platform_message_id": "3"})
    assert [(m["message_id"], m["text"]) for m in store.recovery.unanswered("s1")] == [(one.id, "one"), (two.id, "two")]
    assert [m["text"] for m in store.recovery.unanswered()] == ["one", "other", "two"]
    rows, history = store.messages.unanswered_with_history("s1")
    assert [m["text"] for m in rows] == ["one", "two"]
    assert [(m["role"], m["content"]) for m in history] == [("user", "one"), ("user", "two")]
    store.messages.record_turn("s1", [{"role": "assistant", "content": "both"}], answered=[one.id, two.id])
    assert store.recovery.unanswered("s1") == []
    assert [m["text"] for m in store.recovery.unanswered("s2")] == ["other"]


def test_a_turn_stored_under_a_stale_fencing_token_writes_nothing(pg_url):
    with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as conn:
        db.sessions.create("s1", "telegram")
        asked = db.messages.append_inbound("s1", "hello", platform_message_id="7", inbox={**WHERE, "platform_message_id": "7"},
                                  pending=True)
        first = claim_next(conn, "paused", 15)
        assert first is not None and first.session_id == "s1"  # storing the message marked the session pending
        release(conn, first)  # as if it had expired while its holder was stopped
        second = claim_next(conn, "other", 15)
        assert second is not None and second.token > first.token
        reply = DeliveryRecord("d-stale", "telegram", "42", reply_to="7", text="late")
        with pytest.raises(LeaseLost) as lost:
            db.messages.record_turn("s1", [{"role": "assistant", "content": "late"}], answered=[asked.id], delivery=reply,
                           fence=Fence("s1", first.token))
        assert lost.value.holder == "other"
        with pytest.raises(LeaseLost):
            db.recovery.settle_inbox([asked.id], replace(reply, id="d-line", kind="notice"), session_id="s1",
                            fence=Fence("s1", first.token))
        assert [m.role for m in db.messages.get("s1")] == ["user"]
        assert [m["message_id"] for m in db.recovery.unanswered("s1")] == [asked.id]
        assert db.recovery.pending_deliveries() == [] and db.recovery.list_deliveries("s1") == []
        # the current holder's write goes through
        db.messages.record_turn("s1", [{"role": "assistant", "content": "hi"}], answered=[asked.id],
                       delivery=replace(reply, id="d-ok", text="hi"), fence=Fence("s1", second.token))
        assert [m.content for m in db.messages.get("s1")] == ["hello", "hi"]
        assert get_lease(conn, "s1").holder == "other"


def test_the_lease_goes_back_in_the_transaction_that_marks_the_reply_sent(pg_url):
    with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as conn:
        db.sessions.create("s1", "telegram")
        asked = db.messages.append_inbound("s1", "hello", platform_message_id="7",
                                           inbox={**WHERE, "platform_message_id": "7"}, pending=True)
        lease = claim_next(conn, "i-1", 15)
        assert lease is not None
        reply = DeliveryRecord("d-1", "telegram", "42", reply_to="7", text="hi")
        db.messages.record_turn("s1", [{"role": "assistant", "content": "hi"}], answered=[asked.id], delivery=reply,
                                fence=Fence("s1", lease.token))
        assert get_lease(conn, "s1").holder == "i-1"  # stored, not yet sent: nobody else may claim it
        assert claim_next(conn, "i-2", 15) is None
        db.recovery.update_delivery("d-1", sent_ids=["m1"], status="sent",
                                    handback=Handback("s1", lease.token, lease.pending_seq))
        assert [(r.id, r.status) for r in db.recovery.list_deliveries("s1")] == [("d-1", "sent")]
        assert get_lease(conn, "s1") is None  # given back with the sent mark, the session's work finished
        assert claim_next(conn, "i-2", 15) is None


def test_a_lease_given_back_with_the_sent_mark_leaves_later_work_pending_and_a_stale_one_changes_no_lease(pg_url):
    with SessionDB(pg_url) as db, psycopg.connect(pg_url, autocommit=True) as conn:
        db.sessions.create("s1", "telegram")
        db.messages.append_inbound("s1", "one", platform_message_id="1", inbox={**WHERE, "platform_message_id": "1"},
                                   pending=True)
        lease = claim_next(conn, "i-1", 15)
        db.messages.append_inbound("s1", "two", platform_message_id="2", inbox={**WHERE, "platform_message_id": "2"},
                                   pending=True)  # arrives during the turn
        db.recovery.update_delivery("d-gone", sent_ids=[], status="sent",
                                    handback=Handback("s1", lease.token, lease.pending_seq))
        again = claim_next(conn, "i-2", 15)  # the second message is claimed again
        assert again is not None and again.session_id == "s1" and again.token > lease.token
        db.recovery.update_delivery("d-gone", sent_ids=[], status="sent",
                                    handback=Handback("s1", lease.token, lease.pending_seq))  # late: not its lease
        assert get_lease(conn, "s1").holder == "i-2"


def test_a_hand_back_on_one_instance_only_notes_the_delivery(store):
    store.sessions.create("s1", "telegram")
    store.messages.record_turn("s1", [{"role": "assistant", "content": "hi"}],
                               delivery=DeliveryRecord("d-1", "telegram", "42", text="hi"))
    assert store.recovery.update_delivery("d-1", sent_ids=["m1"], status="sent", handback=Handback("s1", 1, 0))
    assert [(r.status, r.sent_ids) for r in store.recovery.list_deliveries("s1")] == [("sent", ("m1",))]


# -- real daemons ---------------------------------------------------------------------------------


def _assistant_replies(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [(sid, text) for sid, text in conn.execute(
            "SELECT session_id, content FROM messages WHERE role = 'assistant' ORDER BY id").fetchall()]


def _echo(text: str) -> str:
    return f"echo: {text} | turns: 1 | first: {text}"


def _deliveries(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return [(text, status) for text, status in conn.execute("SELECT text, status FROM deliveries").fetchall()]


async def _spread_turns(tmp_path, pg_url: str, side, model: FakeModel) -> dict[str, int]:
    """36 DMs from 12 chats to three instances, the first owning ``side``'s connection: each is stored once
    and answered once; returns the turns each instance claimed (/healthz)."""
    daemons = [Daemon(_dir(tmp_path, name), _settings(pg_url, name, model.base_url, lease_seconds=5, slots=2,
                                                      **side.settings()))
               for name in ("a", "b", "c")]
    messages: list[UserMessage] = []
    try:
        start = await daemons[0].start()
        await side.ready(start, 30.0)  # a owns the connection; b and c stand by, and run turns
        await asyncio.gather(*(daemon.start() for daemon in daemons[1:]))
        for i in range(36):  # 12 chats, 3 DMs each
            index = i % 12
            text = f"c{index:03d} m{i // 12:04d}"
            messages.append(UserMessage(side.chat_of(index), text, time.monotonic(), 0))
            assert await side.send(index, text)
            await asyncio.sleep(0.05)

        def settled() -> bool:
            return not Outcome(side.name, Plan(), True, messages, side.replies(), _stored(pg_url), [], [],
                               "ok", 0).lost()

        await eventually(settled, 60.0, "every DM answered")

        async def released() -> list[dict] | None:  # each lease goes back once its reply is sent
            shown = [(await _health(daemon))["cluster"]["claims"] for daemon in daemons]
            return shown if all(claims["turns"] == [] for claims in shown) else None

        claims = await eventually(released, 10.0, "every lease given back", every=0.1)
        # given back with each reply's sent mark: no renewal found it gone and took it for lost
        assert [shown["leases_lost"] for shown in claims] == [0, 0, 0]
        exit_codes = [await daemon.stop() for daemon in daemons]
    finally:
        await _stop_all(daemons)
    outcome = Outcome(side.name, Plan(), True, messages, side.replies(), await asyncio.to_thread(_stored, pg_url),
                      [], [], "ok", max(exit_codes),
                      log_problems="\n".join(daemon.log_problems() for daemon in daemons))
    assert not outcome.problems(), outcome.report()
    assert outcome.duplicates() == 0, outcome.report()
    ran = {daemon.workdir.name: shown["turns_claimed"] for daemon, shown in zip(daemons, claims, strict=True)}
    assert sum(1 for n in ran.values() if n > 0) >= 2, f"turns ran on one instance only: {ran}"
    return ran


async def test_turns_run_on_every_instance_and_each_dm_is_stored_once_and_answered(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel(delay=0.3) as model:
        await _spread_turns(tmp_path, pg_url, TelegramSide(tg), model)
    assert tg.overlapping_polls == []


async def test_whatsapp_webhooks_reach_every_instance_and_each_message_is_stored_and_answered_once(tmp_path, pg_url):
    from tests.fakes.whatsapp import FakeWhatsApp
    from tests.platformkit.whatsapp import WhatsAppClusterSide

    async with FakeWhatsApp() as wa, FakeModel(delay=0.3) as model:
        side = WhatsAppClusterSide(wa)
        await _spread_turns(tmp_path, pg_url, side, model)
        taken = Counter(d.status for d in wa.deliveries)
    assert len(wa.webhook_urls) == 3
    # each of the 36 messages was taken (200) by one instance and again by the next: stored once all the same
    assert taken[200] >= 72, taken


async def test_signals_event_stream_is_owned_by_one_instance_and_the_standbys_run_turns_and_send(tmp_path, pg_url):
    from tests.fakes.signal_cli import FakeSignalCli
    from tests.platformkit.signal import SignalSide

    async with FakeSignalCli() as sc, FakeModel(delay=0.3) as model:
        await _spread_turns(tmp_path, pg_url, SignalSide(sc), model)
    assert len(sc.stream_requests) == 1, sc.stream_requests  # only the owner ever opened the event stream


async def test_discord_turns_run_on_standbys_that_send_through_the_rest_api(tmp_path, pg_url):
    async with FakeDiscord() as dc, FakeModel(delay=0.3) as model:
        await _spread_turns(tmp_path, pg_url, DiscordSide(dc), model)
    # the standbys logged in for sending only: one gateway connection, identified once, all along
    assert [op["op"] for op in dc.gateway_ops].count(2) == 1 and dc.concurrent_sessions == []
    # every instance's DM replies look the same: none quotes the user's message (the owner knows the DM
    # channels from its events; a standby asks Discord once per channel)
    quoted = [m for ms in dc.messages.values() for m in ms if (m.get("request") or {}).get("message_reference")]
    assert quoted == [], quoted


async def test_slack_socket_mode_turns_run_on_standbys_that_send_through_the_web_api(tmp_path, pg_url):
    async with FakeSlack() as sl, FakeModel(delay=0.3) as model:
        await _spread_turns(tmp_path, pg_url, SlackSide(sl), model)
    # the standbys opened the Web API only: one socket, all along
    assert sl.connections_opened == 1 and len(sl.calls_to("apps.connections.open")) == 1
    assert sl.overlapping_connections == []


@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "sent-whole"])
async def test_a_slack_standby_shows_the_owners_typing_reaction_and_takes_it_off_with_the_reply(tmp_path, pg_url,
                                                                                              streaming):
    # the model answers after 1.5 s: long enough for the typing indicator (after 0.5 s) on every turn
    async with FakeSlack() as sl, FakeModel(delay=1.5) as model:
        side = SlackSide(sl)
        extra = {**side.settings(), "streaming": {"enabled": streaming}}
        daemons = [Daemon(_dir(tmp_path, name), _settings(pg_url, name, model.base_url, lease_seconds=5, slots=1,
                                                          **extra))
                   for name in ("owner", "standby")]
        try:
            await side.ready(await daemons[0].start(), 30.0)
            await daemons[1].start()
            events = [sl.message(side.chat_of(i), f"U{100 + i}", f"think {i}") for i in range(4)]
            for i, event in enumerate(events):  # one turn at a time on each instance: both answer some
                sl.users.setdefault(f"U{100 + i}", f"user{i}")
                await sl.send_event(event)
            await eventually(lambda: len(sl.sent) >= 4, 30.0, "every DM answered")
            claimed = {d.workdir.name: (await _health(d))["cluster"]["claims"]["turns_claimed"] for d in daemons}
            assert claimed["standby"] > 0, claimed
            for daemon in daemons:
                assert await daemon.stop() == 0, daemon.log_problems()
        finally:
            await _stop_all(daemons)
    asked = sorted((e["channel"], e["ts"]) for e in events)
    added = sorted((c.body["channel"], c.body["timestamp"]) for c in sl.calls_to("reactions.add"))
    removed = sorted((c.body["channel"], c.body["timestamp"]) for c in sl.calls_to("reactions.remove"))
    # each user message got the hourglass while it was answered, whichever instance answered it, and lost
    # it with the reply
    assert added == asked, f"turns claimed {claimed}: reactions added {added}, messages {asked}"
    assert {c.body["name"] for c in sl.calls_to("reactions.add")} == {"hourglass_flowing_sand"}
    assert removed == asked, f"turns claimed {claimed}: reactions removed {removed}, messages {asked}"
    assert sorted(m["channel"] for m in sl.sent) == [channel for channel, _ in asked]


async def test_an_instance_paused_past_its_lease_stores_and_sends_nothing_for_the_turn(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel() as model:
        side = TelegramSide(tg)
        daemons = {name: Daemon(_dir(tmp_path, name), _settings(pg_url, name, model.base_url, lease_seconds=2,
                                                                slots=4, **side.settings()))
                   for name in ("a", "b")}
        try:
            start = await daemons["a"].start()
            await side.ready(start, 30.0)
            await daemons["b"].start()
            model.script(Hang(8.0))  # the first answer to the DM is slow: its instance is paused meanwhile
            await side.send(0, "slow one")
            await model.wait_for_requests(1, 15.0)

            async def holder() -> str:
                for name, daemon in daemons.items():
                    if (await _health(daemon))["cluster"]["claims"]["turns"]:
                        return name
                return ""

            running = await eventually(holder, 10.0, "an instance holding the DM's session", every=0.1)
            paused = daemons[running]
            paused.freeze()  # SIGSTOP while its turn waits for the model
            other = daemons["b" if running == "a" else "a"]
            # the lease runs out; the other instance claims the session and answers
            await eventually(lambda: _deliveries(pg_url) == [(_echo("slow one"), "sent")], 30.0,
                             lambda: f"the other instance's answer stored and sent, got {_deliveries(pg_url)}",
                             every=0.1)
            assert len(model.requests) == 2
            paused.proc.send_signal(18)  # SIGCONT
            await eventually(lambda: "LeaseLost" in paused.log_path(0).read_text(), 20.0,
                             "the paused instance saying why it dropped its turn")
            # its turn has ended (the line is logged as it returns); one answer is all the user saw
            replies = side.replies()
            stored = await asyncio.to_thread(_assistant_replies, pg_url)
            deliveries = await asyncio.to_thread(_deliveries, pg_url)
            health = await _health(other)
            paused_health = await _health(paused)
            await asyncio.gather(*(daemon.stop() for daemon in daemons.values()))
        finally:
            await _stop_all(daemons.values())
    assert [(r.chat, r.echoes) for r in replies] == [(side.chat_of(0), "slow one")], replies
    assert len(stored) == 1 and "slow one" in stored[0][1], stored
    assert [status for _, status in deliveries] == ["sent"], deliveries
    assert health["cluster"]["claims"]["turns_claimed"] >= 1
    assert paused_health["cluster"]["claims"]["leases_lost"] == 1
    dropped = [line for line in paused.log_path(0).read_text().splitlines() if "LeaseLost" in line]
    assert dropped and " WARNING " in dropped[0] and "nothing was stored or sent" in dropped[0], dropped
    assert Counter(r.text for r in replies).most_common(1)[0][1] == 1

