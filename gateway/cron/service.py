"""Scheduled jobs inside the daemon: run the agent on a schedule and deliver the answer to a chat.

    cron = CronService(db, turn, deliver, platform_status, CronSettings(agent, model_name, tz), clock)
    await cron.start(config, schedule=True)  # config jobs -> state.db, catch up, apscheduler on
    await cron.run_job("morning")        # one run now (what `switchboard cron run` does)
    await cron.stop(grace_seconds=30)

The ``cron_jobs`` table in state.db is the truth; apscheduler (3.x,
AsyncIOScheduler, memory job store) is only the alarm clock: each job is
armed with a ``DateTrigger`` at its stored ``next_run_at`` and re-armed after
every run.  A poll every ``poll_seconds`` re-reads the table, so jobs added,
edited or paused with the CLI take effect without a restart, and works
through the delivery outbox.

A run (see :meth:`CronService._execute`): take the job's lease in state.db
(one run of a job at a time, across processes), create a session (source
``cron``, key ``agent:<agent>:cron:<job_id>``, title ``<name> <YYYY-MM-DD
HH:MM>``) or continue the job's session (``context: continue``), run one
agent turn offered only the MCP tools the job's ``tools`` globs name (none of the
agent's own: jobs cannot create jobs), end the session with
``cron_complete`` or ``cron_error``, and put the answer in the outbox.  The
daemon delivers it through the router, so the adapter's rate limiter
applies and a busy conversation in that chat does not hold it up; a failed
delivery is recorded as ``delivery_failed`` and retried with backoff, except
a failure no retry can mend (the platform is off, the chat does not exist, the
bot is forbidden to post there: :func:`permanent_failure`), which is recorded
as failed at once with its reason.  ``cron add``/``edit`` refuse a target on a
platform that is off, and ``config check`` warns of one (:func:`target_problem`).
An answer of exactly ``[SILENT]`` is not delivered.

Times missed while no daemon ran: at start (and at every poll) a job whose
``next_run_at`` has passed runs once (coalesced) when its latest due time
is within the job's grace period, and is recorded as ``skipped`` otherwise.

A CLI process (``switchboard cron run``) has no platform adapters: its
answer waits in the outbox with delivery ``pending`` until the daemon
delivers it (starting an adapter there would compete with the daemon for
the bot's updates).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

import state
from gateway.cron.schedule import (
    DEFAULT_GRACE_SECONDS,
    InvalidJob,
    JobSpec,
    Schedule,
    format_duration,
    load_schedule,
    parse_target,
    validate_job,
)
from gateway.errors import BudgetExceeded, ConfigError, ModelUnavailable
from gateway.keys import cron_key
from gateway.retry import Backoff
from gateway.tasks import spawn
from gateway.tools_mcp.policy import job_tools
from gateway.turn import AgentTurn, TurnRequest
from gateway.types import ChatRef, Delivery, PlatformStatus
from gateway.usage import CallContext
from state import CronJobNotFound

log = logging.getLogger(__name__)

SILENT = "[SILENT]"
CONFIG_JOB_FIELDS = ("id", "name", "schedule", "prompt", "deliver", "model", "context", "grace", "tools")


def make_holder() -> str:
    """Who holds a lease: host, pid and a random part (a pid can be reused after a crash)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def config_jobs(config: Any, *, now: float) -> list[tuple[JobSpec, Schedule]]:
    """Validate ``config.cron.jobs``; a bad job raises ConfigError naming ``cron.jobs.<i>.<field>``."""
    tz = config.tzinfo
    out: list[tuple[JobSpec, Schedule]] = []
    seen: dict[str, int] = {}
    source = str(config.source) if config.source else None
    for i, job in enumerate(config.cron.jobs):
        data = job.model_dump()
        unknown = sorted(set(data) - set(CONFIG_JOB_FIELDS))
        if unknown:
            raise ConfigError(f"unknown field; a job has {', '.join(CONFIG_JOB_FIELDS)}", file=source,
                              key=f"cron.jobs.{i}.{unknown[0]}")
        try:
            spec, schedule = validate_job(data, tz, now=now, allow_relative=False, allow_past=True)
        except InvalidJob as exc:
            raise ConfigError(exc.reason, file=source, key=f"cron.jobs.{i}.{exc.field}") from None
        if spec.id in seen:
            raise ConfigError(f"job id {spec.id!r} is used twice (also cron.jobs.{seen[spec.id]}); ids must be unique",
                              file=source, key=f"cron.jobs.{i}.id")
        seen[spec.id] = i
        out.append((spec, schedule))
    return out


def target_problem(config: Any, deliver: str) -> str | None:
    """Why answers for ``deliver`` cannot be delivered with ``config`` (its platform is off), or None."""
    platform = parse_target(deliver).platform
    if platform is None:
        return None
    status = config.enabled_platforms().get(platform, f"off: {platform} is not a platform this gateway knows")
    if status == "on":
        return None
    why = status.removeprefix("off: ")
    return (f"{platform} is off ({why}), so answers for {deliver} could not be delivered; turn it on in the config "
            f"(platforms.{platform}) and restart the daemon, or deliver to local")


# What the platforms say when a chat cannot be reached however often the answer is sent again:
# Telegram "Chat not found" / "Forbidden: bot was blocked by the user", Discord "403 Forbidden" /
# "Unknown Channel", Slack "channel_not_found" / "not_in_channel" / "is_archived".
_PERMANENT = re.compile(r"chat not found|channel_not_found|unknown channel|not_in_channel|is_archived|forbidden|\b403\b",
                        re.IGNORECASE)


def permanent_failure(error: str | None) -> bool:
    """Whether a failed delivery's ``error`` means a retry cannot succeed (no such chat, not allowed there)."""
    return error is not None and _PERMANENT.search(error) is not None


def first_run_at(schedule: Schedule, now: float) -> float | None:
    """``next_run_at`` for a job added or rescheduled at ``now``."""
    if schedule.one_shot:
        return schedule.trigger.run_date.timestamp()
    return schedule.next_after(now)


@dataclass(frozen=True, slots=True)
class CronSettings:
    """What a run needs of the config; all of it needs a restart to change (job definitions come
    with :meth:`CronService.start` and :meth:`CronService.reload`)."""

    agent: str
    model_name: str  # for a job that names no model
    tz: ZoneInfo


# Where an answer goes: the router's delivery (rate limits, pending-delivery records) to a chat.
Deliver = Callable[[ChatRef, str, "str | None"], Awaitable[Delivery]]


class CronService:
    """The scheduler and runner of cron jobs for one gateway (see the module docstring)."""

    def __init__(self, db: state.AsyncSessionDB, turn: AgentTurn, deliver: Deliver,
                 platform_status: Callable[[str], PlatformStatus], settings: CronSettings,
                 clock: Callable[[], float], *, holder: str | None = None, lease_seconds: float = 60.0, poll_seconds: float = 5.0,
                 delivery_backoff: Backoff = Backoff(base=30.0, factor=2.0, cap=1800.0),
                 delivery_attempts: int = 6, delivery_hold_seconds: float = 300.0,
                 claim_tick: Callable[[str, float], Awaitable[bool]] | None = None, budgets: Any = None):
        self.db = db
        self.budgets = budgets  # a gateway.budgetgate.BudgetGate: a job over its budget is skipped
        # Several instances on one store: a scheduled run starts only where this claims its tick first.
        self.claim_tick = claim_tick
        self.turn = turn
        self.deliver = deliver
        self.platform_status = platform_status
        self.settings = settings
        self.tz = settings.tz
        self.clock = clock
        self.holder = holder or make_holder()
        self.lease_seconds = lease_seconds
        self._poll_seconds = poll_seconds
        self.delivery_backoff = delivery_backoff
        self.delivery_attempts = delivery_attempts
        self.delivery_hold_seconds = delivery_hold_seconds
        self.scheduling = False  # True in the daemon: timers, polling and delivery
        self._scheduler: AsyncIOScheduler | None = None
        self._armed: dict[str, float] = {}
        self._poll_task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task] = {}  # job id -> its run in this process
        self._delivering: set[int] = set()
        self._stopping = False
        self.polls = 0  # completed polls (for health and tests)
        self._soon = False

    def now(self) -> float:
        return self.clock()

    @property
    def poll_seconds(self) -> float:
        return self._poll_seconds

    @poll_seconds.setter
    def poll_seconds(self, value: float) -> None:
        """A new interval takes effect at once (the current wait is cut short)."""
        self._poll_seconds = value
        self._wake.set()

    def wake(self) -> None:
        """Poll now rather than at the end of the current interval."""
        self._wake.set()

    def armed(self) -> dict[str, float]:
        """Job id -> the time its alarm is set for, as apscheduler holds them now."""
        if self._scheduler is None:
            return {}
        return {job.id: job.next_run_time.timestamp() for job in self._scheduler.get_jobs()
                if job.next_run_time is not None}

    # -- lifecycle ------------------------------------------------------------------
    async def start(self, config: Any, *, schedule: bool = True) -> None:
        """With ``schedule`` (the daemon): store the jobs of ``config`` (a :class:`~gateway.config.Config`),
        catch up, run the timers.  Without (``switchboard chat``, ``cron run``): nothing starts;
        :meth:`run_job` works."""
        if not schedule:
            return
        await self.sync_config(config)
        self.scheduling = True
        reaped = await self.db.cron.reap_runs(now=self.now())
        for run in reaped:
            log.warning("cron run %s of job %s was interrupted when its process stopped; recorded as an error",
                        run["id"], run["job_id"])
        self._scheduler = AsyncIOScheduler(timezone=self.tz)
        self._scheduler.start()
        self._poll_task = spawn(self._poll_loop(), name="cron:poll")

    async def sync_config(self, config: Any) -> dict:
        """Store the jobs of ``config``'s ``cron.jobs`` (added, changed, removed)."""
        now = self.now()
        rows = []
        for spec, schedule in config_jobs(config, now=now):
            rows.append({**spec.as_row(), "next_run_at": first_run_at(schedule, now)})
        changes = await self.db.cron.sync_config_jobs(rows, now=now)
        for what in ("added", "changed", "removed"):
            if changes[what]:
                log.info("cron jobs from the config %s: %s", what, ", ".join(changes[what]))
        return changes

    async def reload(self, config: Any) -> dict:
        """The config's ``cron`` section changed (SIGHUP; ``config`` is the new one): store
        its jobs and re-arm the timers from the table.  A job whose schedule is unchanged keeps its
        ``next_run_at``; a run is only ever started by taking that time in the store, so a reload
        neither runs a job twice nor loses its next run.  Returns {added, changed, removed}."""
        changes = await self.sync_config(config)
        if self.scheduling and not self._stopping:
            await self.refresh()
            self.wake()  # a new or moved job already due runs now, through the usual catch-up rules
        return changes

    async def stop(self, grace_seconds: float = 30.0) -> None:
        """No new runs; running ones get ``grace_seconds`` to finish, then are cancelled (recorded as errors)."""
        self._stopping = True
        if self._poll_task is not None:
            self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
            self._poll_task = None
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None
        tasks = [t for t in self._running.values() if not t.done()]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace_seconds)
            for task in pending:
                log.warning("cancelling cron run %s at shutdown after %.0fs", task.get_name(), grace_seconds)
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)

    # -- the poll and the timers --------------------------------------------------------
    async def _poll_loop(self) -> None:
        while not self._stopping:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad poll (locked db, ...) is retried at the next one
                log.exception("cron poll failed; retrying in %.0fs", self._poll_seconds)
            self._wake.clear()
            wait, self._soon = (min(self._poll_seconds, 0.25) if self._soon else self._poll_seconds), False
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def poll(self) -> None:
        """One pass: re-read the jobs (CLI changes), start what is due, deliver what waits."""
        jobs = await self.refresh()
        await self.run_due(jobs=jobs)
        await self.deliver_due()
        self.polls += 1

    async def refresh(self) -> list[dict]:
        """Arm a timer for every active job at its ``next_run_at``; drop timers of the others."""
        jobs = await self.db.cron.list_jobs()
        wanted = {j["id"]: j["next_run_at"] for j in jobs if not j["paused"] and j["next_run_at"] is not None}
        if self._scheduler is None:
            return jobs
        for job_id in list(self._armed):
            if job_id not in wanted:
                self._armed.pop(job_id)
                if self._scheduler.get_job(job_id) is not None:
                    self._scheduler.remove_job(job_id)
        for job_id, when in wanted.items():
            if self._armed.get(job_id) == when and self._scheduler.get_job(job_id) is not None:
                continue
            self._armed[job_id] = when
            self._scheduler.add_job(
                self._fire, DateTrigger(run_date=dt.datetime.fromtimestamp(when, self.tz)), args=[job_id],
                id=job_id, name=f"cron:{job_id}", replace_existing=True, misfire_grace_time=None, coalesce=True,
            )
        return jobs

    async def _fire(self, job_id: str) -> None:
        self._armed.pop(job_id, None)
        try:
            await self.run_due(job_ids={job_id})
        except Exception:  # the poll retries
            log.exception("cron job %s could not be started", job_id)

    # -- due runs -------------------------------------------------------------------
    async def run_due(self, *, now: float | None = None, jobs: list[dict] | None = None,
                      job_ids: set[str] | None = None) -> list[dict]:
        """Start every job whose ``next_run_at`` has passed (once, however many times were missed);
        record a skipped run for those whose latest due time is older than their grace period.
        Returns the run rows written (running or skipped); the runs go on as tasks."""
        now = self.now() if now is None else now
        if jobs is None:
            jobs = await self.db.cron.list_jobs()
        out = []
        for job in jobs:
            if job_ids is not None and job["id"] not in job_ids:
                continue
            if job["paused"] or job["next_run_at"] is None or job["next_run_at"] > now or job["id"] in self._running:
                continue
            if self._stopping:
                break
            run = await self._due(job, now)
            if run is not None:
                out.append(run)
        if out and self._scheduler is not None:
            await self.refresh()
        return out

    async def _due(self, job: dict, now: float) -> dict | None:
        schedule = load_schedule(job["schedule"], self.tz, job["created_at"])
        grace = job["grace_seconds"] if job["grace_seconds"] is not None else DEFAULT_GRACE_SECONDS
        latest, last, count = await asyncio.to_thread(schedule.latest_due, job["next_run_at"], now, within=grace)
        following = schedule.next_after(now)
        shown = _local(last, self.tz)
        if latest is None:
            many = f"{count} runs" if count == 1 or count < 1000 else "1000 or more runs"
            reason = (f"missed {many} while no daemon was running (the last was due {shown}); that is more than "
                      f"the grace period of {format_duration(grace)} ago, so it was not run")
            run = await self.db.cron.skip_run(job["id"], now=now, scheduled_at=last, reason=reason,
                                              expect_next_run_at=job["next_run_at"], next_run_at=following)
            if run is not None:
                log.warning("cron job %s: %s", job["id"], reason)
            return run
        note = None
        trigger = "schedule"
        if count > 1:
            trigger = "catch-up"
            note = f"{count if count < 1000 else '1000 or more'} runs were due while no daemon was running; ran once"
        elif now - latest > max(60.0, self._poll_seconds * 2):
            trigger = "catch-up"
            note = f"due {_local(latest, self.tz)}; run late because no daemon was running"
        return await self._begin(job, trigger=trigger, scheduled_at=latest, now=now,
                                 expect=job["next_run_at"], following=following, note=note, wait=False)

    # -- one run ----------------------------------------------------------------------
    async def run_job(self, job_id: str, *, now: float | None = None) -> dict:
        """Run ``job_id`` once now and wait for it; returns the run row.  A run already in
        progress elsewhere (the lease is held) gives a ``skipped`` run saying who holds it."""
        now = self.now() if now is None else now
        job = await self.db.cron.get_job(job_id)
        if job is None:
            raise CronJobNotFound(job_id)
        run = await self._begin(job, trigger="manual", scheduled_at=None, now=now, expect="any",
                                following="keep", note=None, wait=True)
        assert run is not None, "a manual run is never stale (it expects any next run) nor another instance's"
        return run

    async def start_job(self, job_id: str, *, now: float | None = None) -> dict:
        """Start one run of ``job_id`` now without waiting for it (the dashboard's "run now");
        returns the run row, ``running`` (or ``skipped`` when another process holds the lease)."""
        now = self.now() if now is None else now
        job = await self.db.cron.get_job(job_id)
        if job is None:
            raise CronJobNotFound(job_id)
        run = await self._begin(job, trigger="manual", scheduled_at=None, now=now, expect="any",
                                following="keep", note=None, wait=False)
        assert run is not None, "a manual run expects no particular next_run_at, so it is never stale"
        return run

    async def pause_job(self, job_id: str, *, now: float | None = None) -> dict:
        """Stop running ``job_id`` until :meth:`resume_job`; returns the job row."""
        job = await self.db.cron.set_paused(job_id, True, now=self.now() if now is None else now)
        await self._rearm()
        return job

    async def resume_job(self, job_id: str, *, now: float | None = None) -> dict:
        """Run a paused job again from its next time on (times passed while paused are not made up)."""
        now = self.now() if now is None else now
        job = await self.db.cron.get_job(job_id)
        if job is None:
            raise CronJobNotFound(job_id)
        following = next_run_on_resume(job, self.tz, now)
        job = await self.db.cron.set_paused(job_id, False, now=now, next_run_at=following)
        await self._rearm()
        return job

    async def _rearm(self) -> None:
        if self.scheduling and not self._stopping:
            await self.refresh()

    async def _begin(self, job: dict, *, trigger: str, scheduled_at: float | None, now: float, expect: Any,
                     following: Any, note: str | None, wait: bool) -> dict | None:
        if self.claim_tick is not None and scheduled_at is not None and trigger != "manual":
            if not await self.claim_tick(job["id"], scheduled_at):
                log.debug("cron job %s: its run due at %s is another instance's", job["id"], _local(scheduled_at, self.tz))
                return None
        started = await self.db.cron.begin_run(
            job["id"], holder=self.holder, now=now, lease_seconds=self.lease_seconds, trigger=trigger,
            scheduled_at=scheduled_at, deliver=job["deliver"], expect_next_run_at=expect, next_run_at=following,
            note=note,
        )
        if started["status"] == "stale":
            return None
        run = started["run"]
        if started["status"] == "busy":
            log.warning("cron job %s not started: %s", job["id"], run["error"])
            return run
        task = spawn(self._execute(job, run), name=f"cron:{job['id']}:{run['id']}")
        self._running[job["id"]] = task
        job_id = job["id"]
        task.add_done_callback(lambda t: self._running.pop(job_id, None) if self._running.get(job_id) is t else None)
        if wait:
            return await task
        return run

    async def _execute(self, job: dict, run: dict) -> dict:
        key = cron_key(self.settings.agent, job["id"])
        if self.budgets is not None:  # over budget: skipped, recorded as such, no session, no model call
            ctx = CallContext("cron", None, "cron", job["id"], job["id"])
            verdict = await self.budgets.check(ctx)
            if verdict.refused is not None:
                await self.budgets.refused(verdict.refused, ctx)
                return await self._end(job, run, None, output=None, skipped=True,
                                       error=f"over budget: {verdict.refused.rule.name} is used up until "
                                             f"{_local(verdict.refused.resets_at, self.tz)}")
        renewer = spawn(self._renew(job["id"]), name=f"cron-lease:{job['id']}")
        session_id = None
        output = error = None
        skipped = False
        try:
            session_id = await self._session_for(job, run, key)
            await self.db.cron.set_run_session(run["id"], session_id)
            asked = await self.db.messages.append(session_id, "user", job["prompt"])
            result = await self.turn.run(TurnRequest(
                session_id=session_id, session_key=key, platform="cron", user_id=None, answered=(asked,),
                # only the MCP tools the job names (never the agent's own: jobs cannot create jobs)
                tool_names=job_tools((job.get("tools") or "").split(), self.turn.tools.names()),
                model=job["model"], system_notes=(self._note(job),),
            ))
            if result.session_id != session_id:  # compression moved the conversation on
                session_id = result.session_id
                if job["context"] == "continue":
                    await self.db.routes.set(key, session_id)
            output = result.reply
        except asyncio.CancelledError:
            error = "interrupted: the gateway stopped during the run"
            await self._end(job, run, session_id, output=None, error=error)
            raise
        except BudgetExceeded as exc:  # a call of the run was refused: the run is skipped, as recorded
            state = exc.state
            error, skipped = f"over budget: {getattr(getattr(state, 'rule', None), 'name', exc)} is used up until " \
                f"{_local(getattr(state, 'resets_at', None), self.tz)}", True
        except ModelUnavailable as exc:
            error = f"model unavailable: {_model_error(exc)}"
        except Exception as exc:  # recorded on the run; the job keeps its schedule
            log.exception("cron job %s failed", job["id"])
            error = f"{type(exc).__name__}: {exc}"
        finally:
            renewer.cancel()
        return await self._end(job, run, session_id, output=output, error=error, skipped=skipped)

    async def _end(self, job: dict, run: dict, session_id: str | None, *, output: str | None,
                   error: str | None, skipped: bool = False) -> dict:
        now = self.now()
        if session_id and job["context"] != "continue":
            await self.db.sessions.end(session_id, "cron_error" if error else "cron_complete")
        if skipped:
            status, delivery, due = "skipped", None, None
            log.warning("cron job %s run %s skipped: %s", job["id"], run["id"], error)
        elif error is not None:
            status, delivery, due = "error", None, None
            log.warning("cron job %s run %s failed: %s", job["id"], run["id"], error)
        elif (output or "").strip() == SILENT:
            status, delivery, due = "ok", "silent", None
        elif parse_target(run["deliver"]).local:
            status, delivery, due = "ok", "local", None
        else:
            status, delivery, due = "delivering", "pending", now
        finished = await self.db.cron.finish_run(run["id"], holder=self.holder, now=now, status=status,
                                                 session_id=session_id, output=output, error=error,
                                                 delivery=delivery, next_delivery_at=due)
        if finished is None:
            log.warning("cron job %s was removed while run %s was going; its result is dropped", job["id"], run["id"])
            return {**run, "ended_at": now, "status": status, "session_id": session_id, "output": output,
                    "error": error or "the job was removed during the run", "delivery": None}
        log.info("cron job %s run %s finished: %s", job["id"], run["id"], delivery or status)
        if delivery == "pending" and self.scheduling and not self._stopping:
            await self._deliver(finished, now=now)
            finished = await self.db.cron.get_run(run["id"]) or finished  # as delivered (the row stays)
        return finished

    def _note(self, job: dict) -> str:
        return (f'This message comes from the scheduled job "{job["name"]}" ({job["schedule"]}), not from a person '
                f"typing now; your answer is sent to {job['deliver']}. If there is nothing worth sending, "
                f"answer exactly {SILENT}.")

    async def _session_for(self, job: dict, run: dict, key: str) -> str:
        if job["context"] == "continue":
            current = await self.db.routes.get(key)
            session = await self.db.sessions.get(current) if current else None
            if current and session is not None and session.ended_at is None:
                return current
        when = run["scheduled_at"] or run["started_at"]
        base = f"{job['name'][:76]} {dt.datetime.fromtimestamp(when, self.tz):%Y-%m-%d %H:%M}"  # room for " #NN"
        session_id = state.new_session_id()
        for _ in range(5):
            title = await self.db.titles.next_in_lineage(base)
            try:
                await self.db.sessions.create(
                    session_id, "cron", model=job["model"] or self.settings.model_name, session_key=key,
                    title=title, system_prompt=self.turn.settings.persona,
                )
                break
            except state.TitleConflict:  # another job took it between the two calls: next number
                continue
        else:
            await self.db.sessions.create(session_id, "cron", model=job["model"] or self.settings.model_name,
                                         session_key=key, system_prompt=self.turn.settings.persona)
        if job["context"] == "continue":
            await self.db.routes.set(key, session_id)
        return session_id

    async def _renew(self, job_id: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                if not await self.db.cron.renew_lease(job_id, self.holder, now=self.now(),
                                                      lease_seconds=self.lease_seconds):
                    log.error("cron job %s: lost its lease (it expired and another process took it)", job_id)
                    return
            except state.StateError as exc:
                log.warning("cron job %s: could not renew its lease: %s", job_id, exc)

    # -- delivery -----------------------------------------------------------------------
    async def deliver_due(self, *, now: float | None = None) -> list[dict]:
        """Try every delivery that is due (first attempts and retries); returns the updated runs."""
        if not self.scheduling:
            return []
        now = self.now() if now is None else now
        out = []
        for run in await self.db.cron.due_deliveries(now=now):
            if run["id"] in self._delivering:
                continue
            done = await self._deliver(run, now=now)
            if done is not None:
                out.append(done)
        return out

    def _connecting(self, platform: str | None) -> bool:
        """True while the platform's adapter is still starting (the daemon just came up): wait for it
        rather than spend an attempt.  A failed or reconnecting adapter is tried, and its failure recorded."""
        if platform is None:
            return False
        status = self.platform_status(platform)
        return status.running and status.state in ("stopped", "starting")

    async def _deliver(self, run: dict, *, now: float) -> dict | None:
        if self._connecting(parse_target(run["deliver"]).platform):
            self._soon = True  # look again shortly rather than after a whole poll interval
            return None
        claimed = await self.db.cron.claim_delivery(run["id"], now=now, hold_seconds=self.delivery_hold_seconds)
        if claimed is None:
            return None
        self._delivering.add(run["id"])
        try:
            job = await self.db.cron.get_job(run["job_id"])
            name = job["name"] if job else run["job_id"]
            target = parse_target(claimed["deliver"])
            text = f"**{name}**\n\n{(claimed['output'] or '').strip() or '(The model returned an empty answer.)'}"
            error: str | None
            status = self.platform_status(target.platform) if target.platform is not None else None
            if status is None or not status.running or target.platform is None or target.chat_id is None:
                why = (status.why_off if status is not None else None) or "not configured"
                ok, error = False, f"{target.platform} is not running in the daemon ({why})"
                permanent = why.startswith("off")  # off in the config: no retry turns it on
            else:
                delivery = await self.deliver(ChatRef(target.platform, target.chat_id, target.thread_id), text, None)
                ok, error = delivery.ok, delivery.error
                permanent = not ok and permanent_failure(error)
            attempts = claimed["delivery_attempts"] + 1
            retry_at = None
            if not ok and not permanent and attempts < self.delivery_attempts:
                retry_at = self.now() + self.delivery_backoff.delay(attempts - 1)
            if permanent:
                error = f"not retried: {error}"
            recorded = await self.db.cron.record_delivery(run["id"], now=self.now(), ok=ok, error=error,
                                                          retry_at=retry_at)
            if ok:
                log.info("cron job %s run %s delivered to %s", run["job_id"], run["id"], target)
            elif permanent:
                log.error("cron job %s run %s: delivery to %s failed for good: %s",
                          run["job_id"], run["id"], target, error)
            elif retry_at is not None:
                log.warning("cron job %s run %s: delivery to %s failed (attempt %d of %d): %s; retrying at %s",
                            run["job_id"], run["id"], target, attempts, self.delivery_attempts, error,
                            _local(retry_at, self.tz))
            else:
                log.error("cron job %s run %s: delivery to %s failed %d times; giving up: %s",
                          run["job_id"], run["id"], target, attempts, error)
            return recorded
        finally:
            self._delivering.discard(run["id"])


def next_run_on_resume(job: dict, tz: ZoneInfo, now: float) -> float | None:
    """When a paused job runs next once resumed: its schedule's next time after ``now`` (a one-shot keeps
    its time, which may have passed)."""
    schedule = load_schedule(job["schedule"], tz, job["created_at"])
    return schedule.next_after(now) if not schedule.one_shot else job["next_run_at"]


def run_status_line(run: dict, tz: ZoneInfo) -> str:
    """One line for a run: its status, and where its answer went or why it did not."""
    status = run["status"]
    detail = ""
    if run["delivery"] == "pending" and status == "delivering":
        detail = f"waiting for the daemon to deliver to {run['deliver']}"
    elif run["delivery"] == "pending":
        detail = (f"attempt {run['delivery_attempts']} failed: {run['delivery_error']}; "
                  f"next try {_local(run['next_delivery_at'], tz)}")
    elif run["delivery"] == "failed" and (run["delivery_error"] or "").startswith("not retried: "):
        detail = f"delivery failed, {run['delivery_error']}"
    elif run["delivery"] == "failed":
        detail = f"gave up after {run['delivery_attempts']} attempts: {run['delivery_error']}"
    elif run["delivery"] == "delivered":
        detail = f"delivered to {run['deliver']} {_local(run['delivered_at'], tz)}"
    elif run["delivery"] in ("silent", "local"):
        detail = {"silent": "answered [SILENT]: nothing sent", "local": "kept in the store (local)"}[run["delivery"]]
    if run["error"]:
        detail = run["error"]
    return f"{status}" + (f" - {detail}" if detail else "")


def _model_error(exc: ModelUnavailable) -> str:
    """The client's summary ("HTTP 503") plus what the endpoint said, when it said something."""
    body = getattr(exc.__cause__, "body", None)
    said = body.get("message") if isinstance(body, dict) else None
    if isinstance(said, str) and said.strip() and said.strip() not in str(exc):
        return f"{exc}: {said.strip()[:500]}"
    return str(exc)


def _local(ts: float | None, tz) -> str:
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M") if ts else "-"
