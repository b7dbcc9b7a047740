"""Cron job definitions: parsing and validating schedules, delivery targets and jobs.

Three kinds of schedule, all in the configured timezone::

    0 8 * * 1-5          a 5-field cron expression (minute hour day month weekday; 0 and 7 are Sunday)
    every 30m            a fixed interval: m, h or d (counted from when the job was added)
    2026-12-01T09:00     one shot at an ISO 8601 time (an offset like +01:00 may be given)
    in 45m               one shot, relative to now (stored as the absolute time it resolves to)

The time arithmetic is apscheduler's (its triggers); this module only adds
the parsing, cron's weekday numbering and the error messages.  Nothing here
touches the store or the network.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Mapping
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gateway.durations import format_duration, parse_duration
from gateway.errors import InvalidJob
from gateway.platforms import installed_platforms

EXAMPLES = "'0 8 * * 1-5' (08:00 on weekdays), 'every 30m', 'in 45m' or '2026-12-01T09:00'"
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONTEXTS = ("fresh", "continue")
DEFAULT_GRACE_SECONDS = 3600.0
_CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_TRIGGER_FIELDS = ("minute", "hour", "day", "month", "day_of_week")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # cron numbering: 0 (and 7) is Sunday


def _target_form(platform: str) -> str:
    """How a target on ``platform`` is written, as its settings model says (``PlatformConfig.TARGET_FORM``;
    ``<platform>:<chat_id>[:<thread_id>]`` when it says nothing, its adapter being the judge of the ids)."""
    from gateway.config import platform_models

    return platform_models()[platform].target_form()


# --------------------------------------------------------------------------- durations


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule; ``text`` is what is stored (a relative ``in 45m`` becomes its absolute time)."""

    kind: str  # "cron" | "every" | "at"
    text: str
    trigger: Any  # the apscheduler trigger that does the arithmetic
    tz: ZoneInfo

    @property
    def one_shot(self) -> bool:
        return self.kind == "at"

    def next_after(self, after: float) -> float | None:
        """The first fire time strictly after ``after`` (epoch seconds), or None when there is none."""
        moment = dt.datetime.fromtimestamp(after, self.tz) + dt.timedelta(microseconds=1)
        if self.kind == "at":
            when = self.trigger.run_date
            return when.timestamp() if when.timestamp() > after else None
        nxt = self.trigger.get_next_fire_time(None, moment)
        return nxt.timestamp() if nxt is not None else None

    def latest_due(self, first_due: float, now: float, *, within: float) -> tuple[float | None, float | None, int]:
        """Fire times in ``[first_due, now]``: (the latest of them if it is within ``within`` seconds
        of ``now``, else None; the latest of them; how many there were).  Counting stops at 1000."""
        if first_due > now:
            return None, None, 0
        count, last = 0, first_due
        t: float | None = first_due
        while t is not None and t <= now and count < 1000:
            count += 1
            last = t
            t = self.next_after(t)
        # the latest fire time <= now: walk forward from the start of the grace window
        latest = None
        t = first_due if first_due >= now - within else self.next_after(now - within - 1e-6)
        while t is not None and t <= now:
            latest = t
            t = self.next_after(t)
        return latest, (latest if latest is not None else last), count

    def describe(self) -> str:
        if self.kind == "at":
            return f"once at {self.text}"
        return self.text


def _dow_to_names(field: str) -> str:
    """Cron's weekday field in apscheduler's terms (apscheduler 3 counts 0 as Monday; cron as Sunday)."""
    if field == "*" or not re.search(r"\d", field):
        return field
    days: set[int] = set()

    def day(token: str) -> int:
        token = token.lower()
        if token.isdigit():
            n = int(token)
            if n > 7:
                raise ValueError(f"weekday {n} is out of range (0-7, 0 and 7 are Sunday)")
            return n % 7
        if token[:3] in _DAY_NAMES:
            return _DAY_NAMES.index(token[:3])
        raise ValueError(f"{token!r} is not a weekday (0-7 or sun..sat)")

    for part in field.split(","):
        rng, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step_text and (not step_text.isdigit() or step <= 0):
            raise ValueError(f"bad step {step_text!r}")
        if rng == "*":
            lo, hi = 0, 6
        elif "-" in rng:
            a, b = rng.split("-", 1)
            lo, hi = day(a), day(b)
            if b.strip() == "7":
                hi = 7
            if hi < lo:
                raise ValueError(f"range {rng!r} runs backwards")
        else:
            lo = hi = day(rng)
            if step_text:
                hi = 6
        days.update(n % 7 for n in range(lo, hi + 1, step))
    # apscheduler's names, in its Monday-first order
    return ",".join(_DAY_NAMES[n] for n in sorted(days, key=lambda n: (n - 1) % 7))


def _cron(text: str, tz: ZoneInfo) -> Schedule:
    values = text.split()
    if len(values) != 5:
        raise ValueError(f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), this one has {len(values)}")
    fields = dict(zip(_TRIGGER_FIELDS, values, strict=True))
    for (name, value), label in zip(list(fields.items()), _CRON_FIELDS, strict=True):
        try:
            if name == "day_of_week":
                fields[name] = _dow_to_names(value)
            CronTrigger(**{name: fields[name]}, timezone=tz)
        except ValueError as exc:
            raise ValueError(f"the {label} field {value!r} is wrong: {exc}") from None
    return Schedule("cron", " ".join(values), CronTrigger(**fields, timezone=tz), tz)


def parse_schedule(text: Any, tz: ZoneInfo, *, now: float, anchor: float | None = None,
                   allow_relative: bool = True, allow_past: bool = False) -> Schedule:
    """Parse a schedule; ValueError says what is wrong and shows examples.

    ``anchor`` is when an interval starts counting (the job's creation;
    default ``now``).  ``allow_relative=False`` refuses ``in 45m`` (the
    config file is read at every start, so "in 45m" there would never come).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a schedule is required, e.g. {EXAMPLES}")
    raw = " ".join(text.split())
    lowered = raw.lower()
    try:
        if lowered.startswith("every "):
            seconds = parse_duration(raw[6:])
            if seconds < 60:
                raise ValueError("the shortest interval is 1m")
            start = dt.datetime.fromtimestamp(int(anchor if anchor is not None else now), tz)
            trigger = IntervalTrigger(seconds=seconds, start_date=start, timezone=tz)
            return Schedule("every", f"every {format_duration(seconds)}", trigger, tz)
        if lowered.startswith("in "):
            if not allow_relative:
                raise ValueError("a relative time ('in 45m') only works with 'switchboard cron add'; "
                                 "in the config file give an ISO time like 2026-12-01T09:00")
            when = dt.datetime.fromtimestamp(now + parse_duration(raw[3:]), tz).replace(microsecond=0)
            return Schedule("at", when.isoformat(), DateTrigger(run_date=when, timezone=tz), tz)
        if re.match(r"^\d{4}-\d{2}-\d{2}", raw):
            try:
                when = dt.datetime.fromisoformat(raw)
            except ValueError:
                raise ValueError(f"{raw!r} is not an ISO 8601 time; write it like 2026-12-01T09:00 "
                                 "(an offset like +01:00 may follow)") from None
            when = when.replace(tzinfo=tz) if when.tzinfo is None else when
            if when.timestamp() <= now and not allow_past:
                raise ValueError(f"{when.isoformat()} is in the past")
            return Schedule("at", when.isoformat(), DateTrigger(run_date=when, timezone=tz), tz)
        schedule = _cron(raw, tz)
        if schedule.next_after(now) is None:
            raise ValueError("this date never comes (check the day of month against the month)")
        return schedule
    except ValueError as exc:
        raise ValueError(f"{raw!r}: {exc}; examples: {EXAMPLES}") from None


def load_schedule(text: str, tz: ZoneInfo, anchor: float) -> Schedule:
    """A schedule as stored (already validated; one-shot times may lie in the past by now)."""
    if re.match(r"^\d{4}-\d{2}-\d{2}", text):
        when = dt.datetime.fromisoformat(text)
        when = when.replace(tzinfo=tz) if when.tzinfo is None else when
        return Schedule("at", when.isoformat(), DateTrigger(run_date=when, timezone=tz), tz)
    return parse_schedule(text, tz, now=anchor, anchor=anchor)


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True, slots=True)
class Target:
    """Where a job's answer goes: a platform chat, or ``local`` (kept in the store only)."""

    platform: str | None  # None: local
    chat_id: str | None = None
    thread_id: str | None = None

    @property
    def local(self) -> bool:
        return self.platform is None

    def __str__(self) -> str:
        if self.platform is None:
            return "local"
        return ":".join(p for p in (self.platform, self.chat_id, self.thread_id) if p)


def parse_target(text: Any) -> Target:
    if text is None or (isinstance(text, str) and text.strip() in ("", "local")):
        return Target(None)
    hint = "; use local, " + ", ".join(_target_form(p) for p in installed_platforms())
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a delivery target{hint}")
    parts = text.strip().split(":")
    platform = parts[0].lower()
    if platform not in installed_platforms():
        raise ValueError(f"unknown delivery target {text!r}{hint}")
    from gateway.config import platform_models

    model = platform_models()[platform]
    most = 3 if model.TARGET_THREADS else 2
    if not 2 <= len(parts) <= most or not all(p.strip() for p in parts[1:]):
        raise ValueError(f"{text!r} is not a {platform} target; write {_target_form(platform)}")
    chat, thread = parts[1].strip(), (parts[2].strip() if len(parts) == 3 else None)
    problem = model.check_target(chat, thread)
    if problem:
        raise ValueError(problem)
    return Target(platform, chat, thread)


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job definition, as stored in the ``cron_jobs`` table."""

    id: str
    name: str
    schedule: str
    prompt: str
    deliver: str = "local"
    model: str | None = None
    context: str = "fresh"
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    # globs over <server>__<tool>: the MCP tools its runs are offered (gateway.tools_mcp.policy); none: no tool
    tools: tuple[str, ...] = ()

    def as_row(self) -> dict:
        return {"id": self.id, "name": self.name, "schedule": self.schedule, "prompt": self.prompt,
                "deliver": self.deliver, "model": self.model, "context": self.context,
                "grace_seconds": self.grace_seconds, "tools": " ".join(self.tools) or None}


def _tool_globs(value: Any) -> tuple[str, ...]:
    """A job's ``tools``: a list of globs over <server>__<tool> (or, as stored, one text of them apart)."""
    if value in (None, ""):
        return ()
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(g, str) and g.strip() for g in items):
        raise InvalidJob("tools", "is a list of globs over <server>__<tool>, like [\"files__read_*\", \"search__query\"]")
    globs = tuple(g.strip() for g in items)
    bad = [g for g in globs if "__" not in g or any(c.isspace() for c in g)]
    if bad:
        raise InvalidJob("tools", f"{bad[0]!r} is not a glob over <server>__<tool> (an MCP tool), like \"files__read_*\"")
    return globs


def validate_job(data: Mapping[str, Any], tz: ZoneInfo, *, now: float, allow_relative: bool = True,
                 allow_past: bool = False) -> tuple[JobSpec, Schedule]:
    """Check every field; raise :class:`InvalidJob` naming the first bad one."""
    job_id = data.get("id")
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise InvalidJob("id", f"{job_id!r} is not a job id: 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit, e.g. morning-briefing")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        name = job_id
    name = " ".join(name.split())
    if len(name) > 80:
        raise InvalidJob("name", "is longer than 80 characters")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidJob("prompt", "is required: the message the agent is sent at each run")
    try:
        schedule = parse_schedule(data.get("schedule"), tz, now=now, allow_relative=allow_relative,
                                  allow_past=allow_past)
    except ValueError as exc:
        raise InvalidJob("schedule", str(exc)) from None
    try:
        target = parse_target(data.get("deliver"))
    except ValueError as exc:
        raise InvalidJob("deliver", str(exc)) from None
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        model = None
    context = data.get("context") or "fresh"
    if context not in CONTEXTS:
        raise InvalidJob("context", f"{context!r} is not fresh or continue (fresh: a new session each run; "
                                    "continue: one session that goes on)")
    grace = data.get("grace")
    try:
        grace_seconds = DEFAULT_GRACE_SECONDS if grace in (None, "") else parse_duration(str(grace))
    except ValueError as exc:
        raise InvalidJob("grace", str(exc)) from None
    spec = JobSpec(job_id, name, schedule.text, prompt.strip(), str(target), model.strip() if model else None,
                   context, grace_seconds, _tool_globs(data.get("tools")))
    return spec, schedule
