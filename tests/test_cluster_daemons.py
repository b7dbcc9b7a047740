"""Several `switchboard run` processes on one PostgreSQL store: one polls Telegram, the others stand by.

Real daemons (tests/crashkit.py's ``Daemon``), each with a home of its own and the same
``store.url``; the fake Telegram in polling mode and the fake model.  What a user would see:
every DM stored once and answered although the instance that owned the poller was killed, no
more duplicate replies than sends in flight at the kill, and Telegram never answering two
overlapping getUpdates (which it refuses with 409).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections import Counter

import psycopg

from gateway.config import config_from_dict
from gateway.cron.service import config_jobs, first_run_at
from state import SessionDB
from tests.clusterdaemons import (
    health as _health,
    instance_dir as _dir,
    instance_settings as _settings,
    pending as _pending,
    stored as _stored,
)
from tests.crashkit import Daemon, Kill, Outcome, Plan, TelegramSide, UserMessage
from tests.fakes.model_server import FakeModel
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually


async def test_a_standby_takes_over_the_poller_of_a_killed_owner_and_every_dm_is_answered_once(tmp_path, pg_url):
    async with FakeTelegram() as tg, FakeModel(delay=0.2) as model:
        side = TelegramSide(tg)
        daemons = {name: Daemon(_dir(tmp_path, name), _settings(pg_url, name, model.base_url, **side.settings()))
                   for name in ("a", "b")}
        a, b = daemons["a"], daemons["b"]
        messages: list[UserMessage] = []
        kills: list[Kill] = []
        counts: Counter = Counter()

        async def write(seconds: float, cycle: int) -> None:
            for i in range(int(seconds * 20)):  # 20 DMs a second from 8 chats
                index = i % 8
                text = f"c{index:03d} m{counts[index]:04d}"
                counts[index] += 1
                messages.append(UserMessage(side.chat_of(index), text, time.monotonic(), cycle))
                await side.send(index, text)
                await asyncio.sleep(0.05)

        try:
            start = await a.start()
            await side.ready(start, 30.0)
            await b.start()
            assert (await _health(a))["cluster"]["connections"]["telegram"]["role"] == "owner"
            health = await _health(b)
            assert health["cluster"]["instance"] == "b"
            assert health["cluster"]["connections"]["telegram"] == {
                "key": health["cluster"]["connections"]["telegram"]["key"], "role": "standby", "running": False}
            assert health["platforms"]["telegram"]["state"] == "standby" and health["status"] == "ok"

            await write(1.5, 0)
            await a.kill()  # SIGKILL the owner while DMs keep coming
            killed_at = time.monotonic()
            pending = await asyncio.to_thread(_pending, pg_url)
            # what the platform had accepted from the killed owner, before the standby could resend any
            # (taken before the DMs below, which on a loaded machine take longer than their 2.5 s)
            accepted = {(r.chat, r.text.strip()) for r in side.replies()}
            assert time.monotonic() - killed_at < 3.0
            await write(2.5, 1)
            kills.append(Kill(killed_at, pending, 0, "ok",
                              in_flight=sum(1 for chat, text in pending if (chat, text.strip()) in accepted)))

            def settled() -> bool:
                return not Outcome("telegram", Plan(), True, messages, side.replies(), _stored(pg_url), [], [],
                                   "ok", 0).lost()

            await eventually(settled, 60.0, "every DM answered after the takeover")
            assert (await _health(b))["cluster"]["connections"]["telegram"]["role"] == "owner"
            exit_code = await b.stop()
        finally:
            for daemon in daemons.values():
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.kill()
        outcome = Outcome("telegram", Plan(kills=1), True, messages, side.replies(),
                          await asyncio.to_thread(_stored, pg_url), kills, [], "ok", exit_code,
                          log_problems=a.log_problems() + b.log_problems())
        assert not outcome.problems(), outcome.report()
        assert tg.overlapping_polls == [], f"getUpdates overlapped: {tg.overlapping_polls}"
        b_log = b.log_path(0).read_text()
        assert "this instance now owns telegram:" in b_log, b.log_tail()


def _runs(url: str) -> list[tuple[str, float, str]]:
    with psycopg.connect(url) as conn:
        return [(job, scheduled, status) for job, scheduled, status in conn.execute(
            "SELECT job_id, scheduled_at, status FROM cron_runs WHERE trigger <> 'manual' ORDER BY id").fetchall()]


def _store_config_jobs(url: str, cron: dict, first_tick: float) -> None:
    """The config's jobs in the store as an instance that started earlier leaves them, with the next
    tick of the minutely job at ``first_tick``; an instance that starts with the same jobs keeps it."""
    now = time.time()
    rows = [{**spec.as_row(), "next_run_at": first_tick if spec.id == "minutely" else first_run_at(schedule, now)}
            for spec, schedule in config_jobs(config_from_dict({"cron": cron}), now=now)]
    with SessionDB(url) as db:
        db.cron.sync_config_jobs(rows, now=now)


async def test_three_instances_run_each_scheduled_tick_once(tmp_path, pg_url):
    # Seconds away, not at the wall clock's next minute: the one-shot job, and the first tick of
    # the minutely job (stored before the instances start).  An instance that starts late catches up.
    once_at = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(seconds=15)
    async with FakeModel(delay=0.2) as model:
        jobs = {"jobs": [
            {"id": "minutely", "schedule": "* * * * *", "prompt": "tick", "deliver": "local"},
            {"id": "once", "schedule": once_at.strftime("%Y-%m-%dT%H:%M:%S"), "prompt": "once", "deliver": "local"},
        ]}
        await asyncio.to_thread(_store_config_jobs, pg_url, jobs, once_at.timestamp())
        daemons = []
        for name in ("a", "b", "c"):
            daemons.append(Daemon(_dir(tmp_path, name), _settings(pg_url, name, model.base_url, cron=jobs)))
        try:
            await asyncio.gather(*(daemon.start() for daemon in daemons))

            def both_ran_and_ended() -> bool:
                runs = _runs(pg_url)
                return ({job for job, _, _ in runs} == {"minutely", "once"}
                        and all(status != "running" for _, _, status in runs))

            await eventually(both_ran_and_ended, 90.0, "a run of the minutely job and of the one-shot job")
            # Three instances were armed for the same moments: any second run of a tick starts within
            # the same poll as the first; wait one poll (5 s) so that it would show.
            await asyncio.sleep(6)
            runs = await asyncio.to_thread(_runs, pg_url)
            claims = [(await _health(daemon))["cluster"]["claims"]["cron_ticks"] for daemon in daemons]
        finally:
            for daemon in daemons:
                if daemon.proc is not None and daemon.proc.returncode is None:
                    await daemon.stop()
    ticks = Counter((job, scheduled) for job, scheduled, _ in runs)
    assert ticks and all(n == 1 for n in ticks.values()), runs
    assert [scheduled for job, scheduled, _ in runs if job == "once"] == [once_at.timestamp()]
    assert all(status == "ok" for _, _, status in runs), runs
    # each tick claimed by exactly one instance, and /healthz shows which
    claimed = Counter((c["job"], c["scheduled_for"]) for shown in claims for c in shown)
    assert set(claimed) == set(ticks) and all(n == 1 for n in claimed.values()), claims
