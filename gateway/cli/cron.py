"""``switchboard cron``: scheduled jobs in state.db (add, list, show, edit, pause, resume, remove, run, history).

A thin layer over ``SessionDB``'s cron methods and :mod:`gateway.cron.schedule`.
Every command first stores the config file's ``cron.jobs`` (so they are listed
and runnable before the daemon ever started; removing a job from the file
takes effect when the daemon restarts); a running daemon notices any
change within its poll interval (5 s), no restart needed.  Jobs from the config
file are edited there; pause and resume work on every job.

``cron run JOB`` runs the job once in this process.  This process has no
platform connection (starting one would compete with the daemon for the
bot's updates), so a platform-bound answer is stored with delivery
``pending`` and the daemon delivers it; ``local`` answers are shown here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

import click

import state
from gateway.cli.common import config_or_defaults, fail as _fail, home_options, json_option, json_out as _json_out
from gateway.config import Config
from gateway.cron.schedule import EXAMPLES, InvalidJob, format_duration, validate_job
from gateway.errors import ConfigError, SwitchboardError
from state import CronJobNotFound


def _config(config_path: Path | None) -> Config:
    """The config file's settings; without one, the defaults under $SWITCHBOARD_HOME (UTC)."""
    return config_or_defaults(config_path)


def _open(config_path: Path | None) -> tuple[Config, state.SessionDB]:
    """Load the config, open the store and bring the config's jobs into it."""
    from gateway.cron.service import config_jobs, first_run_at

    cfg = _config(config_path)
    cfg.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = state.SessionDB(cfg.store_target, write_timeout=cfg.store.write_timeout_seconds)
    now = time.time()
    try:
        if cfg.source is not None:
            rows = [{**spec.as_row(), "next_run_at": first_run_at(schedule, now)}
                    for spec, schedule in config_jobs(cfg, now=now)]
            db.cron.sync_config_jobs(rows, now=now, remove_missing=False)  # the daemon removes dropped ones
    except ConfigError as exc:
        db.close()
        _fail(str(exc), exc.exit_code)
    except state.StateError as exc:
        db.close()
        _fail(str(exc))
    return cfg, db


def _when(ts: float | None, cfg: Config) -> str:
    return dt.datetime.fromtimestamp(ts, cfg.tzinfo).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _job_or_fail(db: state.SessionDB, job_id: str) -> dict:
    job = db.cron.get_job(job_id)
    if job is None:
        _fail(str(CronJobNotFound(job_id)))
    return job


def _status_line(run: dict, cfg: Config) -> str:
    from gateway.cron.service import run_status_line

    return run_status_line(run, cfg.tzinfo)


@click.group("cron")
def cron_group() -> None:
    """Scheduled jobs: the agent runs a prompt on a schedule and delivers the answer to a chat."""


@cron_group.command("add")
@home_options
@click.argument("name")
@click.option("--schedule", "-s", required=True, help=f"When: {EXAMPLES}.")
@click.option("--prompt", "-p", required=True, help="What the agent is asked at each run.")
@click.option("--deliver", "-d", default="local", show_default=True,
              help="local, telegram:<chat>[:<topic>], discord:<channel>, slack:<channel>[:<thread_ts>] or "
                   "<platform>:<chat>[:<thread>] for another installed platform.")
@click.option("--id", "job_id", default=None, help="The job's id (default: made from the name).")
@click.option("--model", default=None, help="Model for this job (default: the config's model.name).")
@click.option("--context", type=click.Choice(["fresh", "continue"]), default="fresh", show_default=True,
              help="fresh: a new session each run; continue: one session that goes on.")
@click.option("--grace", default=None, help="How late a missed run may still run after a restart (default 1h).")
@click.option("--tools", "tools", multiple=True, metavar="GLOB",
              help="An MCP tool its runs may use, a glob over <server>__<tool> (repeatable; default: none).")
def cron_add(config_path: Path | None, name: str, schedule: str, prompt: str, deliver: str, job_id: str | None,
             model: str | None, context: str, grace: str | None, tools: tuple[str, ...]) -> None:
    """Add a job called NAME."""
    from gateway.cron.service import first_run_at

    cfg, db = _open(config_path)
    with db:
        job_id = job_id or _free_id(db, name)
        now = time.time()
        try:
            spec, sched = validate_job({"id": job_id, "name": name, "schedule": schedule, "prompt": prompt,
                                        "deliver": deliver, "model": model, "context": context, "grace": grace,
                                        "tools": list(tools)},
                                       cfg.tzinfo, now=now)
            _refuse_unreachable(cfg, spec.deliver)
            job = db.cron.add_job(spec.as_row(), source="cli", now=now, next_run_at=first_run_at(sched, now))
        except InvalidJob as exc:
            _fail(str(exc))
            return
        except state.StateError as exc:
            _fail(str(exc))
            return
    click.echo(f"Added job {job['id']} ({job['name']}): {sched.describe()}, next run {_when(job['next_run_at'], cfg)} "
               f"({cfg.timezone}); delivers to {job['deliver']}.")


def _refuse_unreachable(cfg: Config, deliver: str) -> None:
    """Exit with one line when ``deliver`` is on a platform that is off: every run would fail to deliver."""
    from gateway.cron.service import target_problem

    problem = target_problem(cfg, deliver)
    if problem is not None:
        _fail(f"deliver: {problem}")


def _free_id(db: state.SessionDB, name: str) -> str:
    import re

    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:56] or "job"
    candidate, n = base, 2
    while db.cron.get_job(candidate) is not None:
        candidate, n = f"{base}-{n}", n + 1
    return candidate


_JSON_OPTION = json_option("Print JSON for scripts (shape in docs/cli.md).")

def _job_json(job: dict) -> dict:
    return {**job, "paused": bool(job["paused"])}


@cron_group.command("list")
@home_options
@_JSON_OPTION
def cron_list(config_path: Path | None, as_json: bool) -> None:
    """Every job with its schedule, next run and last result."""
    cfg, db = _open(config_path)
    with db:
        jobs = db.cron.list_jobs()
    if as_json:
        _json_out([_job_json(j) for j in jobs])
        return
    if not jobs:
        click.echo("No scheduled jobs. Add one with: switchboard cron add NAME --schedule ... --prompt ...")
        return
    click.echo(f"{'ID':<20} {'NAME':<24} {'SCHEDULE':<26} {'NEXT RUN':<17} {'LAST':<16} {'DELIVER':<22} SOURCE")
    for j in jobs:
        nxt = "paused" if j["paused"] else (_when(j["next_run_at"], cfg) if j["next_run_at"] else "done")
        click.echo(f"{j['id']:<20} {j['name'][:24]:<24} {j['schedule'][:26]:<26} {nxt:<17} "
                   f"{(j['last_status'] or '-'):<16} {j['deliver'][:22]:<22} {j['source']}")


@cron_group.command("show")
@home_options
@click.argument("job_id")
@click.option("--runs", type=click.IntRange(min=0), default=5, show_default=True, help="How many recent runs to show.")
@_JSON_OPTION
def cron_show(config_path: Path | None, job_id: str, runs: int, as_json: bool) -> None:
    """A job's definition, its recent runs and the last answer (how `local` jobs are read)."""
    cfg, db = _open(config_path)
    with db:
        job = _job_or_fail(db, job_id)
        history = db.cron.list_runs(job_id, limit=runs)
    if as_json:
        _json_out({"job": _job_json(job), "runs": history})
        return
    nxt = "paused" if job["paused"] else (_when(job["next_run_at"], cfg) if job["next_run_at"] else "done (one-shot)")
    for label, value in [("id", job["id"]), ("name", job["name"]), ("schedule", f"{job['schedule']} ({cfg.timezone})"),
                         ("next run", nxt), ("deliver", job["deliver"]), ("model", job["model"] or cfg.model.name),
                         ("context", job["context"]), ("grace", format_duration(job["grace_seconds"])),
                         ("tools", job.get("tools") or "none"), ("source", job["source"]), ("prompt", job["prompt"])]:
        click.echo(f"{label + ':':<10} {value}")
    if not runs:
        return  # --runs 0: the definition alone
    if not history:
        click.echo("\nNo runs yet.")
        return
    click.echo("\nRecent runs:")
    for run in history:
        click.echo(f"  #{run['id']:<5} {_when(run['started_at'], cfg)}  {_status_line(run, cfg)}")
    last = next((r for r in history if r["output"] is not None), None)
    if last is not None:
        click.echo(f"\nLast answer (run #{last['id']}, {_when(last['started_at'], cfg)}, session {last['session_id']}):")
        click.echo(last["output"])


@cron_group.command("edit")
@home_options
@click.argument("job_id")
@click.option("--name", default=None)
@click.option("--schedule", "-s", default=None, help=f"When: {EXAMPLES}.")
@click.option("--prompt", "-p", default=None)
@click.option("--deliver", "-d", default=None)
@click.option("--model", default=None, help="Model for this job ('' for the config's model.name).")
@click.option("--context", type=click.Choice(["fresh", "continue"]), default=None)
@click.option("--grace", default=None)
@click.option("--tools", "tools", multiple=True, metavar="GLOB",
              help="Replaces the MCP tools its runs may use (repeatable; --tools '' for none).")
def cron_edit(config_path: Path | None, job_id: str, **changes: Any) -> None:
    """Change a job added with `cron add` (config jobs are edited in the config file)."""
    from gateway.cron.service import first_run_at

    cfg, db = _open(config_path)
    with db:
        job = _job_or_fail(db, job_id)
        if job["source"] == "config":
            _fail(f"job {job_id!r} is defined in the config file (cron.jobs); edit it there and restart the daemon")
        tools = changes.pop("tools")
        given = {k: v for k, v in changes.items() if v is not None}
        if tools:
            given["tools"] = [t for t in tools if t]
        if not given:
            _fail("nothing to change: give --name, --schedule, --prompt, --deliver, --model, --context, --grace "
                  "or --tools")
        now = time.time()
        merged = {**{k: job[k] for k in ("id", "name", "schedule", "prompt", "deliver", "model", "context", "tools")},
                  "grace": f"{int(job['grace_seconds'])}s", **given}
        try:
            spec, sched = validate_job(merged, cfg.tzinfo, now=now)
        except InvalidJob as exc:
            _fail(str(exc))
            return
        if "deliver" in given:
            _refuse_unreachable(cfg, spec.deliver)
        if "schedule" not in given:  # keep the interval's grid and the stored next run
            next_run: Any = "keep"
        else:
            next_run = first_run_at(sched, now) if not job["paused"] else None
        row = spec.as_row()
        updated = db.cron.update_job(job_id, {k: row[k] for k in row if k != "id"}, now=now, next_run_at=next_run)
    click.echo(f"Updated job {job_id}: next run {_when(updated['next_run_at'], cfg) if updated['next_run_at'] else '-'}.")


@cron_group.command("pause")
@home_options
@click.argument("job_id")
def cron_pause(config_path: Path | None, job_id: str) -> None:
    """Stop running a job until `cron resume`."""
    cfg, db = _open(config_path)
    with db:
        _job_or_fail(db, job_id)
        db.cron.set_paused(job_id, True, now=time.time())
    click.echo(f"Paused job {job_id}.")


@cron_group.command("resume")
@home_options
@click.argument("job_id")
def cron_resume(config_path: Path | None, job_id: str) -> None:
    """Run a paused job again from its next time on (times passed while paused are not made up)."""
    from gateway.cron.service import next_run_on_resume

    cfg, db = _open(config_path)
    with db:
        job = _job_or_fail(db, job_id)
        now = time.time()
        nxt = next_run_on_resume(job, cfg.tzinfo, now)
        updated = db.cron.set_paused(job_id, False, now=now, next_run_at=nxt)
    shown = _when(updated["next_run_at"], cfg) if updated["next_run_at"] else "none (the one-shot time has passed)"
    click.echo(f"Resumed job {job_id}: next run {shown}.")


@cron_group.command("remove")
@home_options
@click.argument("job_id")
def cron_remove(config_path: Path | None, job_id: str) -> None:
    """Delete a job and its run history (the sessions of its runs stay)."""
    cfg, db = _open(config_path)
    with db:
        job = _job_or_fail(db, job_id)
        if job["source"] == "config":
            _fail(f"job {job_id!r} is defined in the config file (cron.jobs); remove it there (or pause it)")
        db.cron.remove_job(job_id)
    click.echo(f"Removed job {job_id}.")


@cron_group.command("run")
@home_options
@click.argument("job_id")
def cron_run(config_path: Path | None, job_id: str) -> None:
    """Run a job once now, in this process, and print the answer."""
    from gateway.logging_setup import setup_logging
    from gateway.runtime.daemon import local_gateway

    cfg, db = _open(config_path)
    with db:
        _job_or_fail(db, job_id)
    setup_logging("WARNING", "text", secrets=cfg.secrets())

    async def go() -> dict:
        async with local_gateway(cfg) as gateway:
            assert gateway.cron is not None
            return await gateway.cron.run_job(job_id)

    try:
        run = asyncio.run(go())
    except (SwitchboardError, state.StateError) as exc:
        _fail(str(exc))
        return
    click.echo(f"Run #{run['id']} of {job_id}: {_status_line(run, cfg)}")
    if run["session_id"]:
        click.echo(f"Session: {run['session_id']}")
    if run["output"] is not None:
        click.echo("")
        click.echo(run["output"])
    if run["status"] in ("error", "skipped"):
        sys.exit(1)


@cron_group.command("history")
@home_options
@click.argument("job_id", required=False)
@click.option("--limit", "-n", type=click.IntRange(min=0), default=20, show_default=True, help="How many runs.")
@_JSON_OPTION
def cron_history(config_path: Path | None, job_id: str | None, limit: int, as_json: bool) -> None:
    """Recent runs (of one job, or of all): scheduled time, start, end, status, session, error."""
    cfg, db = _open(config_path)
    with db:
        if job_id is not None:
            _job_or_fail(db, job_id)
        runs = db.cron.list_runs(job_id, limit=limit)
    if as_json:
        _json_out(runs)
        return
    if not limit:
        click.echo("No runs shown (-n 0).")
        return
    if not runs:
        click.echo("No runs recorded.")
        return
    click.echo(f"{'RUN':<6} {'JOB':<18} {'TRIGGER':<9} {'SCHEDULED':<17} {'STARTED':<17} {'ENDED':<17} {'SESSION':<28} STATUS")
    for r in runs:
        click.echo(f"{r['id']:<6} {r['job_id'][:18]:<18} {r['trigger']:<9} {_when(r['scheduled_at'], cfg):<17} "
                   f"{_when(r['started_at'], cfg):<17} {_when(r['ended_at'], cfg):<17} {(r['session_id'] or '-'):<28} "
                   f"{_status_line(r, cfg)}")
