"""SIGKILL the instance that owns a platform connection while users write, on a cluster of real daemons.

Several ``switchboard run`` processes (tests/clusterdaemons.py) share one PostgreSQL store; the one
that owns a platform's connection (the Telegram poller, the Discord gateway, the Slack socket) is
killed with SIGKILL in the middle of the traffic and a standby takes the connection over.  What the
users see is counted as tests/crashkit.py counts it for one daemon: every message stored once and
answered, no more replies sent twice than were in flight at the kills.  Nothing here depends on
which instance ran a turn: only on what the fake platform and the store saw.

* The kill comes when a chat that goes quiet with it has work left in the store (the owner is
  frozen while the store is looked at), so it is answered only if the cluster resumes what the dead
  instance left (its session's lease expires and another instance claims it).
* In flight at a kill: a message the platform accepted and the store never noted as posted (the
  instance died between the two); whoever takes over may post that reply again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Awaitable

from tests.clusterdaemons import (
    FAST_FAILOVER,
    after_kill,
    count_in_flight,
    health,
    instance_dir,
    instance_settings,
    owner_of,
    recorded_ids,
    stored,
    undone_in,
)
from tests.crashkit import Daemon, DiscordSide, Kill, Outcome, Plan, Side, SlackSide, TelegramSide, UserMessage
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually

MODEL_SECONDS = 0.2
UNNOTED = "replies posted after the kills and never noted as sent"


class Load:
    """Users writing one message after another, ``rate`` a second, from ``at_once`` chats in turn.

    At each kill (:meth:`next_cycle`) the first ``retire`` of those chats go quiet for good and as many
    fresh ones take over, so what a kill leaves undone in a quiet chat is answered by a takeover that
    resumes it or by no one (a later message in the chat would be answered with it).  Before message
    ``n`` the load waits for what :meth:`hold_at` was given, so a kill always comes with messages both
    before and after it, however slow the machine.  A message the platform would not deliver
    (Discord, while the bot is offline) is not counted as sent.
    """

    def __init__(self, side: Side, *, total: int, at_once: int, retire: int, rate: float):
        self.side = side
        self.total = total
        self.at_once = at_once
        self.retire = retire
        self.rate = rate
        self.messages: list[UserMessage] = []
        self.cycle = 0  # kills so far
        self._next = 0
        self._holds: dict[int, asyncio.Event] = {}

    def hold_at(self, n: int) -> asyncio.Event:
        """Message ``n`` waits until the event returned is set."""
        return self._holds.setdefault(n, asyncio.Event())

    def retiring(self) -> list[str]:
        """The chats that go quiet at the next kill."""
        first = self.cycle * self.retire
        return [self.side.chat_of(index) for index in range(first, first + self.retire)]

    def next_cycle(self) -> None:
        self.cycle += 1

    async def run(self) -> None:
        while self._next < self.total:
            if self._next in self._holds:
                await self._holds[self._next].wait()
            await self.send_next()
            await asyncio.sleep(1 / self.rate)  # the users' pace

    async def send_next(self) -> bool:
        """Write the next message now; whether the platform delivers it."""
        n, self._next = self._next, self._next + 1
        index = self.cycle * self.retire + n % self.at_once
        text = f"c{index:03d} m{n:04d}"
        at = time.monotonic()
        if not await self.side.send(index, text):
            return False
        self.messages.append(UserMessage(self.side.chat_of(index), text, at, self.cycle))
        return True

    def sent(self, n: int) -> bool:
        return len(self.messages) >= n

    def chats(self) -> int:
        return len({m.chat for m in self.messages})


class Cluster:
    """The instances of one test, each started, killed and stopped as a real process."""

    def __init__(self, root: Path, url: str, model_url: str, side: Side, names: tuple[str, ...]):
        self.url = url
        self.daemons = [Daemon(instance_dir(root, name), instance_settings(url, name, model_url, cluster=FAST_FAILOVER,
                                                                           **side.settings()))
                        for name in names]
        self.kills: list[Kill] = []
        self._writing: asyncio.Task | None = None

    async def __aenter__(self) -> "Cluster":
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop the users writing and SIGKILL whatever still runs (a failed test leaves no process behind)."""
        if self._writing is not None:
            self._writing.cancel()
        for daemon in self.running():
            await daemon.kill()

    async def start_under_load(self, platform: str, connected: Awaitable[object], load: Load,
                               first: int = 30) -> Daemon:
        """Start every instance, wait for ``platform``'s owner and its connection, then let ``load`` write
        until ``first`` messages are sent; the owner."""
        await asyncio.gather(*(d.start() for d in self.daemons))
        owner = await self.owner(platform)
        await connected
        self.start_writing(load)
        await eventually(lambda: load.sent(first), 30.0, f"{first} messages")
        return owner

    def start_writing(self, load: Load) -> None:
        self._writing = asyncio.create_task(load.run())

    async def writing_done(self) -> None:
        assert self._writing is not None
        await self._writing

    def running(self) -> list[Daemon]:
        return [d for d in self.daemons if d.proc is not None and d.proc.returncode is None]

    async def freeze_with_work_left(self, daemon: Daemon, chats: list[str], timeout: float = 30.0) -> None:
        """SIGSTOP ``daemon`` at a moment when one of ``chats`` has work left in the store (a message not
        answered, a reply not sent); it is frozen while the store is looked at, so nothing changes meanwhile."""
        async def frozen_with_work_left() -> bool:
            daemon.freeze()
            if await asyncio.to_thread(undone_in, self.url, chats):
                return True
            daemon.thaw()
            return False

        await eventually(frozen_with_work_left, timeout, f"work left undone in one of {chats}", every=0.05)

    async def kill(self, daemon: Daemon) -> None:
        await daemon.kill()
        self.kills.append(await asyncio.to_thread(after_kill, self.url, time.monotonic()))

    async def owner(self, platform: str, timeout: float = 30.0) -> Daemon:
        """The running instance that owns ``platform``'s connection, once one does."""
        return await eventually(lambda: owner_of(self.running(), platform), timeout,
                                f"a running instance to own the {platform} connection")

    def log_problems(self) -> str:
        return "\n".join(f"[{d.workdir.name}] {line}" for d in self.daemons
                         for line in d.log_problems().splitlines())

    async def close(self) -> int | None:
        """Stop the instances still running (SIGTERM); the exit code of the last one."""
        code = None
        for daemon in self.running():
            code = await daemon.stop()
        return code


async def _settle(side: Side, load: Load, url: str, timeout: float) -> None:
    """Until every message is answered, or ``timeout`` passed (then the outcome tells what was lost)."""
    async def answered() -> bool:
        counted = Counter() if side.redelivers else await asyncio.to_thread(stored, url)
        return not Outcome(side.name, Plan(), side.redelivers, load.messages, side.replies(), counted,
                           [], [], "ok", 0).lost()

    with contextlib.suppress(AssertionError):
        await eventually(answered, timeout, "every message answered after the takeovers", every=0.2)


def _outcome(side: Side, load: Load, cluster: Cluster, exit_code: int | None) -> Outcome:
    replies = side.replies()
    unnoted = count_in_flight(cluster.kills, replies, recorded_ids(cluster.url))
    return Outcome(side.name, Plan(kills=len(cluster.kills)), side.redelivers, load.messages, replies,
                   stored(cluster.url), cluster.kills, [], "ok", exit_code,
                   {**side.notes(), UNNOTED: len(unnoted)},
                   cluster.log_problems(), side.keeps_order)


def check(outcome: Outcome) -> None:
    """Fail with the figures when a user would notice something; print them either way."""
    report = outcome.report().split("\n", 1)[1]  # (its first line names a seed: these kills have none)
    report = f"{outcome.platform}: {len(outcome.kills)} owner(s) killed\n{report}"
    assert not outcome.problems(), report
    # what the duplicates are allowed against is only sound if every reply a live instance posts is noted
    assert outcome.notes[UNNOTED] == 0, report
    print(report)


async def test_three_instances_lose_the_poller_owner_then_its_successor_and_every_dm_is_answered_once(
        tmp_path, pg_url):
    """200 DMs from 20 chats; the owner of the poller is killed, then the instance that took over."""
    async with FakeTelegram() as tg, FakeModel(delay=MODEL_SECONDS) as model:
        side = TelegramSide(tg)
        cluster = Cluster(tmp_path, pg_url, model.base_url, side, ("a", "b", "c"))
        load = Load(side, total=200, at_once=10, retire=5, rate=20.0)  # chats 0-9, then 5-14, then 10-19
        first_killed, second_killed = load.hold_at(100), load.hold_at(170)
        async with cluster:
            first = cluster.daemons[0]
            await side.ready(await first.start(), 30.0)
            await asyncio.gather(*(d.start() for d in cluster.daemons[1:]))
            assert await cluster.owner("telegram") is first

            cluster.start_writing(load)
            await eventually(lambda: load.sent(50), 30.0, "50 DMs")
            await cluster.freeze_with_work_left(first, load.retiring())
            load.next_cycle()
            await cluster.kill(first)
            first_killed.set()

            second = await cluster.owner("telegram")
            took_over = time.monotonic()
            await eventually(lambda: any(r.at > took_over for r in side.replies()), 30.0, "a reply after the takeover")
            await cluster.freeze_with_work_left(second, load.retiring())
            load.next_cycle()
            await cluster.kill(second)
            second_killed.set()

            last = await cluster.owner("telegram")
            await cluster.writing_done()
            await _settle(side, load, pg_url, 60.0)
            shown = (await health(last))["cluster"]
            exit_code = await cluster.close()
        outcome = _outcome(side, load, cluster, exit_code)
    assert len(load.messages) == 200 and load.chats() == 20
    check(outcome)
    assert tg.overlapping_polls == [], f"getUpdates overlapped: {tg.overlapping_polls}"
    assert shown["connections"]["telegram"]["role"] == "owner" and shown["instance"] == last.workdir.name
    for successor in (second, last):
        assert "this instance now owns telegram:" in successor.log_path(0).read_text(), successor.log_tail()


async def test_a_standby_takes_the_discord_gateway_over_from_a_killed_owner(tmp_path, pg_url):
    """Discord drops what it tells an offline bot: every message an instance stored is answered once,
    and every one written after the standby connected is stored; never two sessions open at once."""
    async with FakeDiscord() as dc, FakeModel(delay=MODEL_SECONDS) as model:
        side = DiscordSide(dc)
        cluster = Cluster(tmp_path, pg_url, model.base_url, side, ("a", "b", "c"))
        load = Load(side, total=120, at_once=8, retire=4, rate=15.0)
        killed = load.hold_at(60)
        async with cluster:
            first = await cluster.start_under_load("discord", dc.wait_for_connections(1, 30.0), load)
            await cluster.freeze_with_work_left(first, load.retiring())
            load.next_cycle()
            connects = _connects(dc)
            await cluster.kill(first)
            killed.set()

            await eventually(lambda: _connects(dc) > connects and dc.live_connections > 0, 30.0,
                             "a standby to IDENTIFY or RESUME on the gateway")
            connected = time.monotonic()
            second = await cluster.owner("discord")
            await cluster.writing_done()
            await _settle(side, load, pg_url, 60.0)
            exit_code = await cluster.close()
        outcome = _outcome(side, load, cluster, exit_code)
    check(outcome)
    after = [m for m in load.messages if m.at > connected]
    assert len(after) >= 30, f"only {len(after)} messages written after the takeover"
    assert [m.text for m in after if not outcome.stored[m.text]] == [], "written after the takeover, never stored"
    assert dc.concurrent_sessions == [], f"two gateway sessions open at once: {dc.concurrent_sessions}"
    assert second is not first
    assert "this instance now owns discord:" in second.log_path(0).read_text(), second.log_tail()


def _connects(dc: FakeDiscord) -> int:
    """IDENTIFY and RESUME ops the fake received so far."""
    return sum(1 for op in dc.gateway_ops if op.get("op") in (2, 6))


async def test_a_standby_opens_the_slack_socket_of_a_killed_owner_and_unacknowledged_events_are_answered_once(
        tmp_path, pg_url):
    """Slack sends an envelope the killed owner never acknowledged again, on the standby's socket: it is
    stored once and answered once, as is every event; never two sockets open at once."""
    async with FakeSlack() as sl, FakeModel(delay=MODEL_SECONDS) as model:
        side = SlackSide(sl)
        cluster = Cluster(tmp_path, pg_url, model.base_url, side, ("a", "b"))
        load = Load(side, total=120, at_once=8, retire=4, rate=15.0)
        killed = load.hold_at(60)
        async with cluster:
            first = await cluster.start_under_load("slack", sl.wait_connected(1, 30.0), load)
            await cluster.freeze_with_work_left(first, load.retiring())
            load.next_cycle()
            assert await load.send_next()  # reaches the frozen owner's socket: certainly not acknowledged
            await cluster.kill(first)
            killed.set()

            await sl.wait_connected(2, 30.0)
            second = await cluster.owner("slack")
            await cluster.writing_done()
            await _settle(side, load, pg_url, 60.0)
            exit_code = await cluster.close()
        outcome = _outcome(side, load, cluster, exit_code)
    check(outcome)
    assert sl.overlapping_connections == [], f"two Socket Mode connections open at once: {sl.overlapping_connections}"
    assert second is not first and sl.connections_opened == 2
    assert outcome.notes["envelopes delivered again"] >= 1, "the event sent to the frozen owner came once only"
    assert "this instance now owns slack:" in second.log_path(0).read_text(), second.log_tail()
