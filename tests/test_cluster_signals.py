"""Commands reach every instance: LISTEN/NOTIFY wakes the others, polling stays behind it.

On the store: storing a message marked pending signals ``work`` to every listener at commit, a
``/stop`` is a row with the database's time and signals ``stop``.  With real daemons: ``/stop``
sent to the instance that owns the poller stops the turn another instance runs, and the user sees
that instance's "Stopped" line (the time it took is printed: a figure, not an assertion).
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from state import SessionDB
from state.cluster import Signals, claim, mark_pending
from state.cluster.signals import ask_stop, stops_asked, work_waiting
from tests.clusterdaemons import health, instance_dir, instance_settings
from tests.crashkit import Daemon, TelegramSide
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually


async def test_a_pending_mark_and_a_stop_reach_every_listener_when_their_transaction_commits(pg_url):
    SessionDB(pg_url).close()  # the schema
    heard: list[str] = []
    listeners = [Signals(pg_url, heard.append) for _ in range(2)]
    tasks = [asyncio.create_task(listener.run()) for listener in listeners]
    try:
        await eventually(lambda: all(listener.listening for listener in listeners), 10.0, "both listening")
        heard.clear()  # each (re)connect wakes its pollers once

        def store() -> None:
            with psycopg.connect(pg_url) as conn:
                with conn.transaction():
                    mark_pending(conn, "s1")
                    assert work_waiting(conn, "s1")
                    time.sleep(0.3)  # nothing is heard before the commit
                    assert heard == []

        await asyncio.to_thread(store)
        await eventually(lambda: heard.count("work") == 2, 5.0, lambda: f"work heard twice, heard {heard}")

        def stop() -> tuple[bool, list]:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                since = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]
                running = ask_stop(conn, "agent:main:telegram:dm:7", "s1")
                return running, stops_asked(conn, ["agent:main:telegram:dm:7", "other"], since)

        running, asked = await asyncio.to_thread(stop)
        assert running  # s1 has work waiting
        assert [key for key, _ in asked] == ["agent:main:telegram:dm:7"]
        await eventually(lambda: heard.count("stop") == 2, 5.0, lambda: f"stop heard twice, heard {heard}")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert not work_waiting(conn, "nobody")
            assert claim(conn, "s2", "elsewhere", 30) is not None
            assert work_waiting(conn, "s2")  # a live lease: a turn runs on another instance
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listener in listeners:
            await listener.close()


async def _held(daemons: dict[str, Daemon]) -> dict[str, int]:
    return {name: len((await health(daemon))["cluster"]["claims"]["turns"]) for name, daemon in daemons.items()}


async def _claimed_elsewhere(daemons: dict[str, Daemon], side: TelegramSide, owner: str) -> int:
    """Send DMs from new chats (their turns hang) until one's turn is claimed by an instance other than
    ``owner``; that chat's index."""
    for index in range(12):
        before = await _held(daemons)
        await side.send(index, f"long question {index}")

        async def claimed(before=before) -> str | None:
            now = await _held(daemons)
            grew = [name for name in now if now[name] > before[name]]
            return grew[0] if grew else None

        holder = await eventually(claimed, 15.0, f"chat {index}'s turn claimed", every=0.05)
        if holder != owner:
            return index
    raise AssertionError("the standby claimed none of 12 chats' turns")


async def test_stop_sent_to_the_poller_owner_stops_the_turn_another_instance_runs(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel(delay=60.0) as model:  # every answer hangs until stopped
        side = TelegramSide(tg)
        daemons = {name: Daemon(instance_dir(tmp_path, name), instance_settings(
            pg_url, name, model.base_url, cluster={"lease_seconds": 5}, **side.settings()))
            for name in ("a", "b")}
        try:
            start = await daemons["a"].start()
            await side.ready(start, 30.0)  # a owns the poller: every command is handled there
            await daemons["b"].start()
            await eventually(lambda: health(daemons["b"]), 10.0, "b up")
            index = await _claimed_elsewhere(daemons, side, owner="a")
            chat = side.chat_of(index)
            await model.wait_for_requests(index + 1, 15.0)  # its turn waits for the model on b
            asked = time.monotonic()
            await side.send(index, "/stop")
            stopped = await eventually(
                lambda: next((r for r in side.replies() if r.chat == chat and r.text.startswith("Stopped")), None),
                10.0, lambda: f"b's turn stopped; the chat got {[r.text for r in side.replies() if r.chat == chat]}",
                every=0.01)
            # a's own line goes out through the chat's send pacing: under load it can land after b's
            told = await eventually(
                lambda: next((r for r in side.replies() if r.chat == chat and "Stopping" in r.text), None), 10.0,
                "a's answer to /stop")
            shown = {name: await health(daemon) for name, daemon in daemons.items()}
            for daemon in daemons.values():
                await daemon.kill()
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
    print(f"\n/stop sent at 0; a answered 'Stopping' at {told.at - asked:.3f}s; "
          f"b's turn stopped and its line accepted at {stopped.at - asked:.3f}s "
          f"(from a's answer: {stopped.at - told.at:.3f}s)")
    assert shown["b"]["cluster"]["claims"]["stops_honoured"] == 1
    assert shown["b"]["cluster"]["claims"]["signals"] == "listening"
    assert sorted(r.text for r in side.replies() if r.chat == chat) == sorted([told.text, stopped.text]), \
        "the two lines and no answer after them"
    assert stopped.at - asked < 5.0  # generous: the figure printed above is what counts


async def _answered_by(daemons: dict[str, Daemon], side: TelegramSide, index: int, text: str) -> str:
    """Send ``text`` in chat ``index``, wait for its answer; the instance that claimed its turn."""
    before = {name: (await health(d))["cluster"]["claims"]["turns_claimed"] for name, d in daemons.items()}
    chat = side.chat_of(index)
    await side.send(index, text)
    await eventually(lambda: any(text in r.text for r in side.replies() if r.chat == chat), 15.0,
                     f"{text!r} answered")

    async def who() -> str | None:
        after = {name: (await health(d))["cluster"]["claims"]["turns_claimed"] for name, d in daemons.items()}
        return next((name for name in after if after[name] > before[name]), None)

    return await eventually(who, 5.0, "the instance that answered")


async def test_a_model_chosen_on_one_instance_is_used_by_another_within_a_second(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel() as primary, FakeModel() as fast:
        side = TelegramSide(tg)
        models = {"models": {"fast": {"base_url": fast.base_url, "api_key": "key-fast", "name": "m-fast"}}}
        daemons = {name: Daemon(instance_dir(tmp_path, name), instance_settings(
            pg_url, name, primary.base_url, cluster={"lease_seconds": 5}, **side.settings(), **models))
            for name in ("a", "b")}
        try:
            start = await daemons["a"].start()
            await side.ready(start, 30.0)  # a owns the poller: /model is handled there
            await daemons["b"].start()
            await eventually(lambda: health(daemons["b"]), 10.0, "b up")
            # b answers the chat once: its lane has read the chat's choice (none yet)
            for i in range(20):
                if await _answered_by(daemons, side, 0, f"before {i}") == "b":
                    break
            else:
                raise AssertionError("b answered none of 20 turns")
            await side.send(0, "/model fast")
            await eventually(lambda: any("now uses the model fast" in r.text for r in side.replies()), 10.0,
                             "the switch confirmed")
            await asyncio.sleep(1.1)  # the freshness bound: at most 1 s stale
            fast_before = len(fast.requests)
            for i in range(20):
                if await _answered_by(daemons, side, 0, f"after {i}") == "b":
                    break
            else:
                raise AssertionError("b answered none of 20 turns")
            for daemon in daemons.values():
                await daemon.kill()
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
    # every turn after the switch, b's included, reached the chosen model
    assert len(fast.requests) - fast_before == i + 1, (len(fast.requests), fast_before, i)
    assert fast.requests[-1].last_user_text.startswith("after")
