"""Cron runs in the real gateway: fake model, real Telegram adapter against the fake Bot API, a test clock.

What a user sees is asserted on the fake Telegram (messages it received); what
happened on the run history and the sessions in state.db.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from zoneinfo import ZoneInfo

import pytest

import state
from gateway.errors import ConfigError
from tests.fakes.model_server import Fail, FakeModel, Hang, Reply, ToolCall
from tests.fakes.telegram import FakeTelegram
from tests.harness import Clock, eventually, running_gateway
from tests.test_adapter_telegram import make_adapter

ANN = FakeTelegram.user(111, "Ann")
MORNING = {"id": "morning", "name": "Morning briefing", "schedule": "0 8 * * *", "prompt": "What is on today?",
           "deliver": "telegram:111"}


@pytest.fixture
async def model():
    async with FakeModel() as fake:
        yield fake


@pytest.fixture
async def tg():
    async with FakeTelegram() as fake:
        yield fake


async def until(predicate, what: str, timeout: float = 10.0):
    """Poll an async or plain predicate until it returns something truthy."""
    return await eventually(predicate, timeout, what, every=0.02)


def telegram_gateway(home, fake_model, tg, /, *, jobs=(MORNING,), clock=None, **overrides):
    adapter = make_adapter(tg)
    return running_gateway(home, fake_model, clock=clock, adapters={"telegram": adapter},
                           cron={"jobs": list(jobs)}, auth={"allowed_users": ["telegram:111"]}, **overrides)


async def connected(gw):
    await until(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", "telegram connected")


async def test_a_run_is_a_cron_session_delivered_to_the_chat(tmp_path, model, tg):
    model.script(Reply("Sunny, 3 meetings."))
    clock = Clock()
    async with telegram_gateway(tmp_path, model, tg, clock=clock, timezone="Europe/Berlin") as gw:
        await connected(gw)
        run = await gw.cron.run_job("morning")
        session = await gw.db.sessions.get(run["session_id"])
        messages = await gw.db.messages.get(run["session_id"])
    [sent] = tg.sent
    assert (sent.chat_id, sent.visible_text) == (111, "Morning briefing\n\nSunny, 3 meetings.")
    assert (run["status"], run["delivery"], run["delivery_attempts"], run["trigger"]) == ("ok", "delivered", 1, "manual")
    assert session.source == "cron" and session.session_key == "agent:main:cron:morning"
    assert session.end_reason == "cron_complete"
    berlin = dt.datetime.fromtimestamp(run["started_at"], dt.timezone.utc).astimezone(ZoneInfo("Europe/Berlin"))
    assert session.title == f"Morning briefing {berlin:%Y-%m-%d %H:%M}"  # in the configured timezone
    assert [(m.role, m.content) for m in messages] == [("user", "What is on today?"), ("assistant", "Sunny, 3 meetings.")]
    [request] = model.requests
    assert "tools" not in request.body  # jobs cannot create jobs: no tools offered
    notes = [m["content"] for m in request.messages if m["role"] == "system"]
    assert any('scheduled job "Morning briefing"' in n and "[SILENT]" in n for n in notes)


async def test_titles_stay_unique_and_a_continue_job_keeps_one_session(tmp_path, model):
    jobs = [{"id": "a", "name": "Check", "schedule": "every 1h", "prompt": "first?"},
            {"id": "b", "name": "Diary", "schedule": "every 1h", "prompt": "again?", "context": "continue"}]
    fixed = dt.datetime(2026, 11, 22, 9, 15, 30, tzinfo=dt.timezone.utc).timestamp()
    async with running_gateway(tmp_path, model, clock=lambda: fixed, cron={"jobs": jobs}) as gw:
        one, two = await gw.cron.run_job("a"), await gw.cron.run_job("a")
        titles = [(await gw.db.sessions.get(r["session_id"])).title for r in (one, two)]
        d1, d2 = await gw.cron.run_job("b"), await gw.cron.run_job("b")
        diary = await gw.db.sessions.get(d1["session_id"])
    assert one["session_id"] != two["session_id"]
    assert titles == ["Check 2026-11-22 09:15", "Check 2026-11-22 09:15 #2"]  # same minute: numbered
    assert d1["session_id"] == d2["session_id"] and diary.ended_at is None
    assert d2["output"] == "echo: again? | turns: 2 | first: again?"  # the second run saw the first
    assert (d1["delivery"], d1["status"]) == ("local", "ok")


async def test_silent_answers_are_not_delivered(tmp_path, model, tg):
    model.script(Reply("  [SILENT]\n"))
    async with telegram_gateway(tmp_path, model, tg) as gw:
        await connected(gw)
        run = await gw.cron.run_job("morning")
    assert (run["status"], run["delivery"], run["output"].strip()) == ("ok", "silent", "[SILENT]")
    assert tg.sent == [] and tg.calls("sendMessage") == []


async def test_a_failed_delivery_is_recorded_retried_with_backoff_and_never_called_delivered(tmp_path, model, tg):
    clock = Clock()
    tg.fail_next("sendMessage", 4, status=502, description="Bad Gateway")  # the adapter's own 4 tries
    async with telegram_gateway(tmp_path, model, tg, clock=clock) as gw:
        await connected(gw)
        run = await gw.cron.run_job("morning")
        assert (run["status"], run["delivery"], run["delivery_attempts"]) == ("delivery_failed", "pending", 1)
        assert "Bad Gateway" in run["delivery_error"] and run["delivered_at"] is None
        assert tg.sent == []
        wait = run["next_delivery_at"] - clock()
        assert 15 <= wait <= 30  # the first backoff step (30 s, jittered)
        gw.cron.poll_seconds = 0.05  # polls before the time comes do not retry
        polls = gw.cron.polls
        await until(lambda: gw.cron.polls > polls + 1, "two polls")
        assert tg.sent == [] and (await gw.db.cron.get_run(run["id"]))["delivery_attempts"] == 1
        clock.advance(wait + 1)
        gw.cron.wake()
        done = await until(lambda: _delivered(gw, run["id"]), "the retried delivery")
        [sent] = tg.sent
    assert sent.visible_text.startswith("Morning briefing\n\necho: What is on today?")
    assert (done["status"], done["delivery_attempts"]) == ("ok", 2)


async def _delivered(gw, run_id):
    run = await gw.db.cron.get_run(run_id)
    return run if run["delivery"] == "delivered" else None


@pytest.mark.slow  # 10 s measured under load: `make test-fast` leaves it out
async def test_a_delivery_that_keeps_failing_is_given_up_as_failed(tmp_path, model, tg):
    clock = far_from_the_morning_run()  # its three hours of retries must not reach the job's own 08:00 run
    tg.fail_next("sendMessage", 20, status=502, description="Bad Gateway")
    async with telegram_gateway(tmp_path, model, tg, clock=clock) as gw:
        await connected(gw)
        gw.cron.delivery_attempts = 3
        gw.cron.poll_seconds = 0.05
        run = await gw.cron.run_job("morning")
        for attempt in (2, 3):
            clock.advance(3600)
            gw.cron.wake()
            run = await until(lambda: _attempts(gw, run["id"], attempt), f"attempt {attempt}")  # noqa: B023 - called within this iteration
        clock.advance(3600)
        gw.cron.wake()
        polls = gw.cron.polls
        await until(lambda: gw.cron.polls > polls + 1, "two more polls")
        final = await gw.db.cron.get_run(run["id"])
    assert (final["status"], final["delivery"], final["delivery_attempts"]) == ("delivery_failed", "failed", 3)
    assert "Bad Gateway" in final["delivery_error"] and final["delivered_at"] is None
    assert tg.sent == [] and len(tg.calls("sendMessage")) == 3 * 4  # 3 deliveries, each tried 4 times by the adapter


def far_from_the_morning_run() -> Clock:
    """A clock at the next noon (UTC, the default timezone): MORNING's schedule, 08:00, is 20 hours away."""
    clock = Clock()
    now = dt.datetime.fromtimestamp(clock(), dt.timezone.utc)
    noon = now.replace(hour=12, minute=0, second=0, microsecond=0)
    clock.advance(((noon if noon > now else noon + dt.timedelta(days=1)) - now).total_seconds())
    return clock


async def _attempts(gw, run_id, n):
    run = await gw.db.cron.get_run(run_id)
    return run if run["delivery_attempts"] >= n else None


async def test_delivery_to_a_platform_that_is_off_fails_at_once_and_is_not_retried(tmp_path, model):
    async with running_gateway(tmp_path, model, cron={"jobs": [{**MORNING, "deliver": "slack:C123"}]}) as gw:
        run = await gw.cron.run_job("morning")
    assert (run["status"], run["delivery"], run["delivery_attempts"]) == ("delivery_failed", "failed", 1)
    assert run["delivery_error"] == ("not retried: slack is not running in the daemon "
                                     "(off: platforms.slack.bot_token is not set)")
    assert run["next_delivery_at"] is None


@pytest.mark.parametrize("status,description", [
    (400, "Bad Request: chat not found"),
    (403, "Forbidden: bot was blocked by the user"),
])
async def test_a_chat_that_cannot_be_reached_fails_at_once_with_its_reason(tmp_path, model, tg, status, description):
    tg.fail_next("sendMessage", 5, status=status, description=description)
    async with telegram_gateway(tmp_path, model, tg) as gw:
        await connected(gw)
        gw.cron.poll_seconds = 0.05
        run = await gw.cron.run_job("morning")
        polls = gw.cron.polls
        await until(lambda: gw.cron.polls > polls + 2, "three more polls")
        final = await gw.db.cron.get_run(run["id"])
    assert (final["status"], final["delivery"], final["delivery_attempts"]) == ("delivery_failed", "failed", 1)
    assert final["delivery_error"].startswith("not retried: ")
    assert description.split(": ")[1] in final["delivery_error"].lower()
    assert final["next_delivery_at"] is None and len(tg.calls("sendMessage")) == 1


async def test_delivery_goes_out_while_a_conversation_in_that_chat_is_busy(tmp_path, model, tg):
    model.script(Hang(60))
    async with telegram_gateway(tmp_path, model, tg) as gw:
        await connected(gw)
        tg.dm(ANN, "a long question")
        await model.wait_for_requests(1)
        assert gw.router.active_lanes() == 1
        model.script(Reply("Your reminder."))
        run = await gw.cron.run_job("morning")
        assert run["delivery"] == "delivered" and gw.router.active_lanes() == 1  # the turn is still running
        assert [s.visible_text for s in tg.sent] == ["Morning briefing\n\nYour reminder."]
        assert gw.router.stop_turn("agent:main:telegram:dm:111")
        await tg.wait_for_sent(2)


async def test_a_model_error_is_recorded_and_the_job_keeps_its_schedule(tmp_path, model, tg):
    model.script(Fail(503, message="upstream overloaded"))
    async with telegram_gateway(tmp_path, model, tg, model={"max_retries": 0}) as gw:
        await connected(gw)
        before = await gw.db.cron.get_job("morning")
        run = await gw.cron.run_job("morning")
        session = await gw.db.sessions.get(run["session_id"])
        after = await gw.db.cron.get_job("morning")
        again = await gw.cron.run_job("morning")
    assert run["status"] == "error" and run["error"].startswith("model unavailable:")
    assert "overloaded" in run["error"] and run["delivery"] is None
    assert session.end_reason == "cron_error"
    assert after["next_run_at"] == before["next_run_at"] and not after["paused"]
    assert again["status"] == "ok"  # the next run works
    assert [s.visible_text.split("\n\n")[0] for s in tg.sent] == ["Morning briefing"]  # the error was not sent


async def test_missed_runs_are_coalesced_after_a_restart(tmp_path, model):
    clock = Clock()
    hourly = {"id": "hourly", "name": "Hourly", "schedule": "every 1h", "prompt": "tick"}
    strict = {"id": "strict", "name": "Strict", "schedule": "every 1h", "prompt": "tock", "grace": "10m"}
    async with running_gateway(tmp_path, model, clock=clock, cron={"jobs": [hourly, strict]}) as gw:
        first_due = (await gw.db.cron.get_job("hourly"))["next_run_at"]
        assert await until(lambda: "hourly" in gw.cron.armed(), "the alarm is set")
        assert gw.health()["cron"]["jobs_armed"] == 2  # /healthz shows what is scheduled
    clock.advance(5.5 * 3600)  # down for 5.5 hours: due 5 times, the last 30 minutes ago
    async with running_gateway(tmp_path, model, clock=clock, cron={"jobs": [hourly, strict]}) as gw:
        runs = await until(lambda: _finished_runs(gw, 2), "the catch-up")
        hourly_job = await gw.db.cron.get_job("hourly")
        strict_job = await gw.db.cron.get_job("strict")
    ran = next(r for r in runs if r["job_id"] == "hourly")
    skipped = next(r for r in runs if r["job_id"] == "strict")
    assert (ran["status"], ran["trigger"], ran["scheduled_at"]) == ("ok", "catch-up", first_due + 4 * 3600)
    assert ran["note"] == "5 runs were due while no daemon was running; ran once"
    assert skipped["status"] == "skipped" and skipped["session_id"] is None
    assert skipped["error"].startswith("missed 5 runs while no daemon was running")
    assert "more than the grace period of 10m ago" in skipped["error"]
    assert [r.last_user_text for r in model.requests] == ["tick"]  # one run, not five
    assert hourly_job["next_run_at"] == first_due + 5 * 3600 and strict_job["next_run_at"] == first_due + 5 * 3600


async def _finished_runs(gw, n):
    runs = await gw.db.cron.list_runs()
    done = [r for r in runs if r["status"] not in ("running", "delivering")]
    return done if len(done) >= n else None


async def test_the_alarm_fires_at_next_run_at(tmp_path, model):
    async with running_gateway(tmp_path, model, cron={"jobs": [{"id": "soon", "schedule": "every 1h", "prompt": "go"}]}) as gw:
        gw.cron.poll_seconds = 3600  # only apscheduler's alarm can start it
        when = time.time() + 0.5
        await gw.db.cron.update_job("soon", {}, now=time.time(), next_run_at=when)
        await gw.cron.refresh()
        assert gw.cron.armed()["soon"] == pytest.approx(when, abs=1e-3)
        [run] = await until(lambda: _finished_runs(gw, 1), "the alarm")
        job = await gw.db.cron.get_job("soon")
    assert (run["status"], run["trigger"], run["scheduled_at"]) == ("ok", "schedule", when)
    assert job["next_run_at"] > when + 3000


async def test_a_run_cut_by_shutdown_is_recorded_and_its_lease_released(tmp_path, model):
    model.script(Hang(60))
    async with running_gateway(tmp_path, model, cron={"jobs": [{"id": "slow", "schedule": "every 1h", "prompt": "p"}]}) as gw:
        task = asyncio.create_task(gw.cron.run_job("slow"))
        await model.wait_for_requests(1)
        await gw.cron.stop(grace_seconds=0.1)
        with pytest.raises(asyncio.CancelledError):
            await task
        [run] = await gw.db.cron.list_runs("slow")
        lease = await gw.db.cron.get_lease("slow")
        session = await gw.db.sessions.get(run["session_id"])
    assert run["status"] == "error" and run["error"] == "interrupted: the gateway stopped during the run"
    assert lease is None and session.end_reason == "cron_error"


async def test_a_bad_job_in_the_config_stops_the_start_naming_it(tmp_path, model):
    with pytest.raises(ConfigError) as err:
        async with running_gateway(tmp_path, model, cron={"jobs": [{"id": "x", "schedule": "every day", "prompt": "p"}]}):
            pass
    assert err.value.key == "cron.jobs.0.schedule" and "'every day': 'day' is not a duration" in str(err.value)


async def test_cli_changes_are_picked_up_by_a_running_daemon(tmp_path, model):
    from click.testing import CliRunner

    from gateway.cli.main import main

    home = tmp_path / "home"
    clock = Clock()
    runner = CliRunner()
    env = {"SWITCHBOARD_HOME": str(home), "SWITCHBOARD_CONFIG": None}

    async def cli(*args):
        result = await asyncio.to_thread(runner.invoke, main, ["cron", *args], env=env)
        assert result.exit_code == 0, result.output
        return result.output

    async with running_gateway(home, model, clock=clock) as gw:
        gw.cron.poll_seconds = 0.05
        assert gw.cron.armed() == {}
        out = await cli("add", "Ping", "--schedule", "every 1h", "--prompt", "ping?")
        assert out.startswith("Added job ping (Ping): every 1h, next run ")
        job = state.SessionDB(home / "state.db")
        try:
            stored = job.cron.get_job("ping")
        finally:
            job.close()
        await until(lambda: gw.cron.armed().get("ping") == pytest.approx(stored["next_run_at"], abs=1e-3), "the new alarm")
        clock.advance(3600 + 5)
        [run] = await until(lambda: _finished_runs(gw, 1), "the run")
        assert run["output"] == "echo: ping? | turns: 1 | first: ping?"
        await cli("pause", "ping")
        await until(lambda: "ping" not in gw.cron.armed(), "the alarm removed")
        clock.advance(2 * 3600)
        polls = gw.cron.polls
        await until(lambda: gw.cron.polls > polls + 2, "a few polls")
        assert len(await gw.db.cron.list_runs("ping")) == 1  # paused: nothing ran
        await cli("remove", "ping")
        assert await gw.db.cron.get_job("ping") is None


async def test_a_slack_channel_that_does_not_exist_fails_at_once(tmp_path, model):
    from tests.fakes.slack import FakeSlack
    from tests.test_adapter_slack import make_adapter as make_slack_adapter

    async with FakeSlack() as slack:
        slack.error_next("chat.postMessage", "channel_not_found", n=5)
        job = {**MORNING, "deliver": "slack:C404"}
        async with running_gateway(tmp_path, model, adapters={"slack": make_slack_adapter(slack)},
                                   cron={"jobs": [job]}) as gw:
            await until(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", "slack connected")
            run = await gw.cron.run_job("morning")
    assert (run["status"], run["delivery"], run["delivery_attempts"]) == ("delivery_failed", "failed", 1)
    assert run["delivery_error"].startswith("not retried: ") and "channel_not_found" in run["delivery_error"]


async def test_a_run_cannot_use_a_tool_even_when_the_model_asks_for_one(tmp_path, model, tg):
    model.script(ToolCall("memory", {"target": "user", "action": "add", "content": "Ann likes mornings"}),
                 Reply("Sunny."))
    async with telegram_gateway(tmp_path, model, tg) as gw:
        await connected(gw)
        run = await gw.cron.run_job("morning")
        messages = await gw.db.messages.get(run["session_id"])
    assert "tools" not in model.requests[0].body  # none offered: jobs cannot create jobs
    [tool_result] = [m for m in messages if m.role == "tool"]
    assert tool_result.content == "error: no tool is available now, not 'memory'"
    assert not list((tmp_path / "memory").rglob("USER.md"))  # the memory tool never ran
    assert run["output"] == "Sunny."
