"""Cron schedules, targets and job validation; the jobs/runs/leases tables, two stores contending for a lease."""

from __future__ import annotations

import datetime as dt
import threading
from zoneinfo import ZoneInfo

import pytest

import state
from gateway.config import config_from_dict
from gateway.cron.schedule import InvalidJob, parse_schedule, parse_target, validate_job
from gateway.cron.service import config_jobs
from gateway.durations import parse_duration, time_ago
from gateway.errors import ConfigError
from state import CronJobExists, CronJobNotFound

BERLIN = ZoneInfo("Europe/Berlin")
# Saturday 2026-11-21 10:00 in Berlin
SAT = dt.datetime(2026, 11, 21, 10, 0, tzinfo=BERLIN).timestamp()


def local(ts: float, tz=BERLIN) -> str:
    return dt.datetime.fromtimestamp(ts, tz).strftime("%a %Y-%m-%d %H:%M")


# -- schedules -------------------------------------------------------------------------


def test_cron_expressions_use_crons_weekday_numbers_in_the_configured_timezone():
    weekdays = parse_schedule("0 8 * * 1-5", BERLIN, now=SAT)
    first = weekdays.next_after(SAT)
    assert local(first) == "Mon 2026-11-23 08:00"
    assert local(weekdays.next_after(first)) == "Tue 2026-11-24 08:00"
    # 0 and 7 are Sunday, as in crontab(5) (apscheduler 3 alone would read 0 as Monday)
    assert local(parse_schedule("30 9 * * 0", BERLIN, now=SAT).next_after(SAT)) == "Sun 2026-11-22 09:30"
    assert local(parse_schedule("30 9 * * 7", BERLIN, now=SAT).next_after(SAT)) == "Sun 2026-11-22 09:30"
    assert local(parse_schedule("0 12 * * sat,sun", BERLIN, now=SAT).next_after(SAT)) == "Sat 2026-11-21 12:00"
    assert local(parse_schedule("0 7 * * 0-2", BERLIN, now=SAT).next_after(SAT)) == "Sun 2026-11-22 07:00"
    every_quarter = parse_schedule("*/15 * * * *", BERLIN, now=SAT)
    assert local(every_quarter.next_after(SAT)) == "Sat 2026-11-21 10:15"
    # the same expression in another timezone fires at another instant
    utc = parse_schedule("0 8 * * 1-5", ZoneInfo("UTC"), now=SAT).next_after(SAT)
    assert utc - first == 3600


def test_intervals_and_one_shot_times():
    every = parse_schedule("every 30m", BERLIN, now=SAT)
    assert every.text == "every 30m" and every.next_after(SAT) == SAT + 1800
    assert every.next_after(SAT + 1800) == SAT + 3600
    assert parse_schedule("every 2h", BERLIN, now=SAT).next_after(SAT) == SAT + 7200
    assert parse_schedule("Every  1D", BERLIN, now=SAT).text == "every 1d"
    soon = parse_schedule("in 45m", BERLIN, now=SAT)
    assert soon.one_shot and soon.text == "2026-11-21T10:45:00+01:00"
    assert soon.next_after(SAT) == SAT + 2700 and soon.next_after(SAT + 2700) is None
    naive = parse_schedule("2026-12-01T09:00", BERLIN, now=SAT)
    assert naive.text == "2026-12-01T09:00:00+01:00"
    offset = parse_schedule("2026-12-01 09:00+00:00", BERLIN, now=SAT)
    assert offset.next_after(SAT) - naive.next_after(SAT) == 3600
    assert parse_duration("90s") == 90 and parse_duration("2 hours") == 7200


@pytest.mark.parametrize("text, says", [
    ("61 * * * *", "the minute field '61' is wrong"),
    ("0 25 * * *", "the hour field '25' is wrong"),
    ("0 8 * * 9", "weekday 9 is out of range (0-7, 0 and 7 are Sunday)"),
    ("0 8 * *", "a cron expression has 5 fields (minute hour day-of-month month day-of-week), this one has 4"),
    ("0 0 31 2 *", "this date never comes"),
    ("every 10s", "the shortest interval is 1m"),
    ("every fortnight", "'fortnight' is not a duration: write a positive number and a unit, like 30m, 2h or 1d"),
    ("in 0m", "is not a duration"),
    ("2026-11-01T09:00", "2026-11-01T09:00:00+01:00 is in the past"),
    ("2026-13-01T09:00", "is not an ISO 8601 time; write it like 2026-12-01T09:00"),
    ("tomorrow at nine", "a cron expression has 5 fields"),
    ("", "a schedule is required"),
])
def test_bad_schedules_say_what_is_wrong_and_show_an_example(text, says):
    with pytest.raises(ValueError) as err:
        parse_schedule(text, BERLIN, now=SAT)
    message = str(err.value)
    assert says in message
    assert "'0 8 * * 1-5' (08:00 on weekdays), 'every 30m', 'in 45m' or '2026-12-01T09:00'" in message


def test_missed_times_are_counted_and_the_latest_within_the_grace_found():
    hourly = parse_schedule("0 * * * *", BERLIN, now=SAT)
    first = hourly.next_after(SAT)  # 11:00
    now = first + 5.5 * 3600  # 16:30: due at 11, 12, 13, 14, 15, 16
    latest, last, count = hourly.latest_due(first, now, within=3600)
    assert (local(latest), local(last), count) == ("Sat 2026-11-21 16:00", "Sat 2026-11-21 16:00", 6)
    latest, last, count = hourly.latest_due(first, now, within=600)  # 16:00 is 30 minutes old
    assert latest is None and local(last) == "Sat 2026-11-21 16:00" and count == 6
    assert hourly.latest_due(first, first - 1, within=3600) == (None, None, 0)
    minutely = parse_schedule("* * * * *", BERLIN, now=SAT)
    latest, _, count = minutely.latest_due(SAT + 60, SAT + 30 * 86400, within=3600)
    assert count == 1000 and latest == SAT + 30 * 86400  # counting stops; the latest is still exact


# -- targets and jobs ----------------------------------------------------------------------


def test_delivery_targets():
    assert str(parse_target("telegram:-1001234:42")) == "telegram:-1001234:42"
    t = parse_target("slack:C0123:1712345678.123456")
    assert (t.platform, t.chat_id, t.thread_id) == ("slack", "C0123", "1712345678.123456")
    assert parse_target("discord:998877").chat_id == "998877"
    assert parse_target("telegram:@news_channel").chat_id == "@news_channel"
    assert parse_target("local").local and parse_target(None).local
    for bad, says in [("irc:#general", "unknown delivery target"), ("discord:1:2", "write discord:<channel_id>"),
                      ("telegram:me", "telegram chat ids are numbers, or @name"), ("discord:general", "discord channel ids are numbers"), ("slack:", "is not a slack target"),
                      ("telegram:1:topic", "a telegram topic id is a number")]:
        with pytest.raises(ValueError, match=says):
            parse_target(bad)


def test_validate_job_names_the_field():
    base = {"id": "morning", "name": "Morning briefing", "schedule": "0 8 * * *", "prompt": "Summarise",
            "deliver": "telegram:123", "context": "continue", "grace": "2h"}
    spec, schedule = validate_job(base, BERLIN, now=SAT)
    assert spec.as_row() == {"id": "morning", "name": "Morning briefing", "schedule": "0 8 * * *", "prompt": "Summarise",
                             "deliver": "telegram:123", "model": None, "context": "continue", "grace_seconds": 7200.0,
                             "tools": None}
    for change, field in [({"id": "no spaces"}, "id"), ({"prompt": " "}, "prompt"), ({"schedule": "daily"}, "schedule"),
                          ({"deliver": "sms:1"}, "deliver"), ({"context": "forever"}, "context"), ({"grace": "soon"}, "grace")]:
        with pytest.raises(InvalidJob) as err:
            validate_job({**base, **change}, BERLIN, now=SAT)
        assert err.value.field == field and str(err.value).startswith(f"{field}: ")


def test_config_jobs_are_validated_with_their_key_path(tmp_path):
    def cfg(*jobs):
        return config_from_dict({"home": str(tmp_path), "timezone": "Europe/Berlin", "cron": {"jobs": list(jobs)}})

    good = {"id": "a", "schedule": "every 1h", "prompt": "p"}
    [(spec, _)] = config_jobs(cfg(good), now=SAT)
    assert spec.name == "a" and spec.deliver == "local"
    cases = [
        ((good, {"id": "b", "schedule": "99 * * * *", "prompt": "p"}), "cron.jobs.1.schedule", "the minute field '99' is wrong"),
        (({"id": "b", "schedule": "in 45m", "prompt": "p"},), "cron.jobs.0.schedule", "only works with 'switchboard cron add'"),
        ((good, dict(good)), "cron.jobs.1.id", "job id 'a' is used twice (also cron.jobs.0)"),
        (({**good, "schedul": "x"},), "cron.jobs.0.schedul", "unknown field"),
        (({**good, "deliver": "telegram"},), "cron.jobs.0.deliver", "is not a telegram target"),
    ]
    for jobs, key, says in cases:
        with pytest.raises(ConfigError) as err:
            config_jobs(cfg(*jobs), now=SAT)
        assert err.value.key == key and says in str(err.value) and err.value.exit_code == 78
    # a one-shot time in the config that has passed is fine (it ran, or is recorded as skipped)
    config_jobs(cfg({"id": "c", "schedule": "2020-01-01T08:00", "prompt": "p"}), now=SAT)


# -- the store ------------------------------------------------------------------------------


JOB = {"id": "j", "name": "J", "schedule": "every 1h", "prompt": "p", "deliver": "local", "model": None,
       "context": "fresh", "grace_seconds": 3600.0}


def test_jobs_table_add_edit_pause_remove_and_config_sync(store):
    with store as db:
        db.cron.add_job(JOB, source="cli", now=100.0, next_run_at=3700.0)
        with pytest.raises(CronJobExists):
            db.cron.add_job(JOB, source="cli", now=100.0, next_run_at=3700.0)
        with pytest.raises(CronJobNotFound, match="switchboard cron list"):
            db.cron.update_job("nope", {"name": "x"}, now=1.0)
        assert db.cron.update_job("j", {"name": "Jay", "source": "config"}, now=200.0)["name"] == "Jay"
        paused = db.cron.set_paused("j", True, now=300.0)
        assert (paused["paused"], paused["next_run_at"], paused["source"]) == (1, 3700.0, "cli")
        # config sync: adds, keeps next_run_at while unchanged, refuses a clash with a CLI job, removes dropped ones
        cfg_job = {**JOB, "id": "c", "next_run_at": 5000.0}
        assert db.cron.sync_config_jobs([cfg_job], now=400.0) == {"added": ["c"], "changed": [], "removed": []}
        assert db.cron.sync_config_jobs([{**cfg_job, "next_run_at": 9999.0}], now=500.0)["changed"] == []
        assert db.cron.get_job("c")["next_run_at"] == 5000.0
        moved = db.cron.sync_config_jobs([{**cfg_job, "prompt": "new", "next_run_at": 9999.0}], now=600.0)
        assert moved["changed"] == ["c"] and db.cron.get_job("c")["next_run_at"] == 5000.0  # same schedule
        db.cron.sync_config_jobs([{**cfg_job, "schedule": "every 2h", "next_run_at": 7800.0}], now=600.0)
        assert db.cron.get_job("c")["next_run_at"] == 7800.0
        with pytest.raises(CronJobExists, match="cron.jobs has a job 'j'"):
            db.cron.sync_config_jobs([{**JOB, "next_run_at": 1.0}], now=700.0)
        assert db.cron.sync_config_jobs([], now=800.0, remove_missing=False)["removed"] == []
        assert db.cron.sync_config_jobs([], now=800.0)["removed"] == ["c"]
        assert [j["id"] for j in db.cron.list_jobs()] == ["j"]
        assert db.cron.remove_job("j") and db.cron.list_jobs() == []


def test_two_stores_in_threads_never_run_one_job_twice(store_target):
    path = store_target
    with state.SessionDB(path) as db:
        db.cron.add_job(JOB, source="cli", now=100.0, next_run_at=3700.0)
    contenders = 6
    barrier = threading.Barrier(contenders)
    results: list[dict] = []

    def contend(i: int) -> None:
        with state.SessionDB(path) as db:
            barrier.wait()
            results.append(db.cron.begin_run("j", holder=f"proc-{i}", now=3700.0, lease_seconds=60, trigger="manual",
                                             scheduled_at=None, deliver="local"))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["busy"] * (contenders - 1) + ["running"]
    [winner] = [r for r in results if r["status"] == "running"]
    with state.SessionDB(path) as db:
        runs = db.cron.list_runs("j")
        assert sorted(r["status"] for r in runs) == ["running"] + ["skipped"] * (contenders - 1)
        assert all(f"held by {winner['run']['holder']}" in r["error"] for r in runs if r["status"] == "skipped")
        # the scheduled path: only one caller moves next_run_at on; the others see a stale time
        db.cron.finish_run(winner["run"]["id"], holder=winner["run"]["holder"], now=3710.0, status="ok",
                           output="done", delivery="local")
        first = db.cron.begin_run("j", holder="a", now=3720.0, lease_seconds=60, trigger="schedule", scheduled_at=3700.0,
                                  deliver="local", expect_next_run_at=3700.0, next_run_at=7300.0)
        second = db.cron.begin_run("j", holder="b", now=3720.0, lease_seconds=60, trigger="schedule", scheduled_at=3700.0,
                                   deliver="local", expect_next_run_at=3700.0, next_run_at=7300.0)
        assert first["status"] == "running" and second["status"] == "stale"
        # a holder that died: once its lease expires another takes over and its run becomes an error
        assert db.cron.renew_lease("j", "a", now=3730.0, lease_seconds=60)
        assert not db.cron.renew_lease("j", "b", now=3730.0, lease_seconds=60)
        assert db.cron.begin_run("j", holder="b", now=3780.0, lease_seconds=60, trigger="manual", scheduled_at=None,
                                 deliver="local")["status"] == "busy"
        took = db.cron.begin_run("j", holder="b", now=3800.0, lease_seconds=60, trigger="manual", scheduled_at=None,
                                 deliver="local")
        assert took["status"] == "running"
        dead = db.cron.get_run(first["run"]["id"])
        assert dead["status"] == "error" and dead["error"].startswith("interrupted")
        assert not db.cron.renew_lease("j", "a", now=3810.0, lease_seconds=60)


def test_instances_syncing_the_config_jobs_at_once_add_each_job_once(store_target):
    """Several instances start together and sync the same cron.jobs: each job is added by one of them."""
    state.SessionDB(store_target).close()  # the schema exists: only the sync races
    jobs = [{**JOB, "id": f"c{i}", "next_run_at": 5000.0} for i in range(3)]
    barrier = threading.Barrier(4)
    results: list[dict] = []

    def sync() -> None:
        with state.SessionDB(store_target) as db:
            barrier.wait()
            results.append(db.cron.sync_config_jobs(jobs, now=100.0))

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(job for r in results for job in r["added"]) == ["c0", "c1", "c2"]
    with state.SessionDB(store_target) as db:
        assert [j["id"] for j in db.cron.list_jobs()] == ["c0", "c1", "c2"]


def test_delivery_outbox_claims_once_and_records_every_attempt(store):
    with store as db:
        db.cron.add_job({**JOB, "deliver": "telegram:1"}, source="cli", now=0.0, next_run_at=3600.0)
        run = db.cron.begin_run("j", holder="h", now=10.0, lease_seconds=60, trigger="manual", scheduled_at=None,
                                deliver="telegram:1")["run"]
        db.cron.finish_run(run["id"], holder="h", now=20.0, status="delivering", output="hi", delivery="pending",
                           next_delivery_at=20.0)
        assert db.cron.get_lease("j") is None  # released
        assert [r["id"] for r in db.cron.due_deliveries(now=20.0)] == [run["id"]]
        assert db.cron.claim_delivery(run["id"], now=20.0, hold_seconds=300) is not None
        assert db.cron.claim_delivery(run["id"], now=21.0, hold_seconds=300) is None  # taken
        assert db.cron.due_deliveries(now=21.0) == []
        failed = db.cron.record_delivery(run["id"], now=22.0, ok=False, error="403 blocked", retry_at=60.0)
        assert (failed["status"], failed["delivery"], failed["delivery_attempts"], failed["delivered_at"]) == (
            "delivery_failed", "pending", 1, None)
        assert db.cron.due_deliveries(now=59.0) == [] and len(db.cron.due_deliveries(now=60.0)) == 1
        db.cron.claim_delivery(run["id"], now=60.0, hold_seconds=300)
        done = db.cron.record_delivery(run["id"], now=61.0, ok=True)
        assert (done["status"], done["delivery"], done["delivery_attempts"], done["delivered_at"]) == (
            "ok", "delivered", 2, 61.0)


def test_old_runs_are_pruned_but_waiting_deliveries_kept(store):
    from state import _cron

    with store as db:
        db.cron.add_job(JOB, source="cli", now=0.0, next_run_at=3600.0)
        ids = []
        for i in range(6):
            run = db.cron.begin_run("j", holder="h", now=10.0 + i, lease_seconds=60, trigger="manual",
                                    scheduled_at=None, deliver="local")["run"]
            pending = i == 0  # the oldest still waits for its delivery
            db.cron.finish_run(run["id"], holder="h", now=10.5 + i, status="delivering" if pending else "ok",
                               output=str(i), delivery="pending" if pending else "local",
                               next_delivery_at=11.0 if pending else None)
            ids.append(run["id"])
        db._engine.write(_cron._prune_runs, "j", keep=3)
        assert [r["id"] for r in db.cron.list_runs("j")] == [ids[5], ids[4], ids[3], ids[0]]


def test_how_long_ago_reads_as_a_person_would_say_it():
    now = 1_000_000.0
    assert [time_ago(t, now) for t in (None, now - 5, now - 150, now - 7300, now - 3 * 86400 - 5, now + 30)] == \
        ["-", "just now", "2 min ago", "2 h ago", "3 d ago", "just now"]
    assert time_ago(None, now, never="never") == "never"
