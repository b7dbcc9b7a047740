"""The dashboard's pages: Health, Sessions (search, transcript, export), Cron, Usage and Pairing.

Each handler reads through the async store (never on the event loop), renders one template, and
for a change calls what the CLI calls: the store's pairing methods, the cron service's
``start_job`` / ``pause_job`` / ``resume_job``.  Unknown ids get the 404 page.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping
from urllib.parse import quote, urlencode
from zoneinfo import ZoneInfo

from aiohttp import web
from markupsafe import Markup

import state
from gateway.budgets import period_key
from gateway.charts import usage_svg
from gateway.cron.service import run_status_line
from gateway.durations import time_ago
from gateway.insights import account_names, daily_chart, from_summary, window
from gateway.platforms import installed_platforms, sources
from gateway.runtime.dashboard import transcript
from gateway.runtime.dashboard.app import redirect
from gateway.runtime.dashboard.schedules import readable_schedule
from gateway.runtime.storage_view import OBJECTS_SHOWN, report_json, size

if TYPE_CHECKING:
    from gateway.runtime.dashboard.app import Dashboard

log = logging.getLogger(__name__)

PAGE_SIZE = 50
MAX_PAGE = 1_000_000  # 50 million sessions; past it an offset is no page (and no longer fits a database integer)
SEARCH_LIMIT = 50
# A table or index at its engine's smallest size on disk (SQLite's one 4 KiB page, PostgreSQL's one
# 8 KiB index page, an empty PostgreSQL table's 0) holds nothing or next to nothing: the Storage page
# folds those into one line instead of a row each.
SMALLEST_OBJECT_BYTES = {"sqlite": 4096, "postgresql": 8192}
DELETED_SHARE_RULES = 200  # up to this many budget rules, the page says how much is of deleted sessions
HISTORY_LIMIT = 30
DEAD_LETTERS_SHOWN = 20
USAGE_GROUPINGS = ("model", "purpose", "platform", "day", "user", "chat")
USAGE_TOP = 20  # groups shown on the usage page; the rest are one row
USAGE_MAX_DAYS = 366
STORAGE_FRESH_SECONDS = 60.0  # the Storage page's report is reused this long (dbstat reads every page)
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class Sources:
    """What the pages read and act on, handed over by the daemon."""

    db: state.AsyncSessionDB
    health: Callable[[], dict]  # the gateway's /healthz view
    cron: Any  # gateway.cron.service.CronService
    tz: ZoneInfo
    instance: dict  # agent, host, pid, home, version
    queued_messages: Callable[[], int]  # messages waiting in the router's lanes
    identities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # the config's identities:
    budgets: Any = None  # gateway.budgetgate.BudgetGate: the budgets page (None: not shown)


@dataclass(frozen=True, slots=True)
class SessionFilters:
    """The sessions page's filters, as the query string gave them (``problem`` says what was not understood)."""

    platform: str = ""
    user: str = ""
    title: str = ""
    since: str = ""  # YYYY-MM-DD, in the gateway's timezone
    until: str = ""  # YYYY-MM-DD, that day included
    query: str = ""
    page: int = 1
    problem: str = ""

    def link(self, **changes: Any) -> str:
        values = {"platform": self.platform, "user": self.user, "title": self.title, "since": self.since,
                  "until": self.until, "q": self.query, "page": self.page}
        values.update(changes)
        kept = {k: v for k, v in values.items() if v and not (k == "page" and v == 1)}
        return "/ui/sessions" + (f"?{urlencode(kept)}" if kept else "")


class Pages:
    def __init__(self, sources: Sources):
        self.src = sources
        self.ui: Dashboard | None = None
        self._storage: tuple[float, dict] | None = None  # (measured at, report_json) for the Storage page
        self._storage_lock = asyncio.Lock()  # one measurement at a time, however many tabs ask

    def routes(self, app: web.Application, ui: Dashboard) -> None:
        self.ui = ui
        get, post = app.router.add_get, app.router.add_post
        get("/ui/", self.health)
        get("/ui/health/fragment", self.health_fragment)
        get("/ui/sessions", self.sessions)
        get("/ui/sessions/{session_id}", self.session)
        get("/ui/sessions/{session_id}/export.{kind}", self.export)
        get("/ui/cron", self.cron)
        get("/ui/cron/{job_id}", self.cron_job)
        get("/ui/cron/runs/fragment", self.runs_fragment)
        get("/ui/cron/{job_id}/runs/fragment", self.runs_fragment)
        post("/ui/cron/{job_id}/{action}", self.cron_action)
        get("/ui/usage", self.usage)
        get("/ui/storage", self.storage)
        get("/ui/budgets", self.budgets)
        post("/ui/budgets/set", self.budget_set)
        post("/ui/budgets/reset", self.budget_reset)
        get("/ui/pairing", self.pairing)
        post("/ui/pairing/approve", self.pairing_approve)
        post("/ui/pairing/revoke", self.pairing_revoke)

    def filters(self) -> dict[str, Callable]:
        tz = self.src.tz

        def when(ts: float | None) -> str:
            return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M") if ts else "-"

        def schedule(text: str) -> str:
            return readable_schedule(text, getattr(tz, "key", str(tz)))

        return {"when": when, "ago": time_ago, "duration": duration, "highlighted": transcript.highlighted,
                "schedule": schedule,
                "url": lambda part: quote(str(part), safe="")}

    def _render(self, request: web.Request, template: str, page: str, **context: Any) -> web.Response:
        assert self.ui is not None
        return self.ui.render(request, template, {"page": page, **context})

    # -- health ---------------------------------------------------------------------
    async def _health_context(self) -> dict:
        health = self.src.health()
        counts = await self.src.db.recovery.counts()
        dead = await self.src.db.dead_letters.list(status="held", limit=DEAD_LETTERS_SHOWN)
        return {"health": health, "counts": counts, "dead_letters": dead, "instance": self.src.instance,
                "queued": self.src.queued_messages(), "now": time.time()}

    async def health(self, request: web.Request) -> web.StreamResponse:
        return self._render(request, "health.html", "health", **await self._health_context())

    async def health_fragment(self, request: web.Request) -> web.StreamResponse:
        return self._render(request, "_health.html", "health", **await self._health_context())

    # -- sessions -------------------------------------------------------------------
    def _session_filters(self, request: web.Request) -> tuple[SessionFilters, dict]:
        q = request.query
        platform = q.get("platform", "").strip().lower()
        problems = []
        if platform and platform not in sources():
            problems.append(f"unknown platform {platform!r} (one of {', '.join(sources())})")
            platform = ""
        try:
            page = int(q.get("page", "1"))
            if not 1 <= page <= MAX_PAGE:
                raise ValueError
        except ValueError:
            problems.append(f"page must be a whole number from 1 to {MAX_PAGE:,}; showing page 1")
            page = 1
        args: dict[str, Any] = {}
        since, until = q.get("since", "").strip(), q.get("until", "").strip()
        for name, text, key, days in (("since", since, "active_since", 0), ("until", until, "active_before", 1)):
            if not text:
                continue
            try:
                day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=self.src.tz)
            except ValueError:
                problems.append(f"{name} must be a date like 2026-01-31")
                continue
            args[key] = (day + dt.timedelta(days=days)).timestamp()
        filters = SessionFilters(platform=platform, user=q.get("user", "").strip(), title=q.get("title", "").strip(),
                                 since=since, until=until, query=q.get("q", "").strip(), page=page,
                                 problem="; ".join(problems))
        if filters.platform:
            args["source"] = filters.platform
        if filters.user:
            args["user"] = filters.user
        if filters.title:
            args["title_contains"] = filters.title
        return filters, args

    async def sessions(self, request: web.Request) -> web.StreamResponse:
        filters, args = self._session_filters(request)
        if filters.query:
            # any text is accepted: a query the search cannot read finds nothing, as in the CLI
            hits = await self._conversation_hits(await self.src.db.search.messages(
                filters.query, source_filter=[filters.platform] if filters.platform else None, limit=SEARCH_LIMIT))
            return self._render(request, "sessions.html", "sessions", filters=filters, sources=sources(), hits=hits,
                                rows=[], more=False)
        rows = await self.src.db.sessions.list_rich(limit=PAGE_SIZE + 1, offset=(filters.page - 1) * PAGE_SIZE, **args)
        return self._render(request, "sessions.html", "sessions", filters=filters, sources=sources(), hits=None,
                            rows=rows[:PAGE_SIZE], more=len(rows) > PAGE_SIZE)

    async def _conversation_hits(self, hits: list[dict]) -> list[dict]:
        """One row per conversation, as ``sessions list`` shows it: a compression chain by its newest tip.

        The best match of each conversation is kept (the search ranks them); ``tip`` is where the
        conversation goes on, ``more`` how many other matches it holds."""
        tips: dict[str, str] = {}
        rows: dict[str, dict] = {}
        for hit in hits:
            session_id = hit["session_id"]
            if session_id not in tips:
                tips[session_id] = await self.src.db.sessions.compression_tip(session_id) or session_id
            tip = tips[session_id]
            if tip in rows:
                rows[tip]["more"] += 1
            else:
                rows[tip] = {**hit, "tip": tip, "more": 0}
        return list(rows.values())

    async def _record(self, request: web.Request) -> dict:
        record = await self.src.db.transfer.export(request.match_info["session_id"])
        if record is None:
            raise web.HTTPNotFound()
        return record

    async def session(self, request: web.Request) -> web.StreamResponse:
        record = await self._record(request)
        db = self.src.db
        parent = await db.sessions.get(record["parent_session_id"]) if record.get("parent_session_id") else None
        children = [s for s in await db.sessions.descendants(record["id"]) if s.parent_session_id == record["id"]]
        lineage = transcript.Lineage(parent=parent, children=children, tip=await db.sessions.compression_tip(record["id"]))
        # Markdown takes CPU (0.1-1.5 ms a message): a long transcript renders off the event loop
        messages = await asyncio.to_thread(lambda: [transcript.shown(m) for m in record["messages"]])
        return self._render(request, "session.html", "sessions", session=record, lineage=lineage, messages=messages,
                            summaries=[m["summary"] for m in messages if m["summary"] is not None])

    async def export(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if kind not in ("json", "md"):
            raise web.HTTPNotFound()
        record = await self._record(request)
        name = _SAFE_NAME.sub("_", record["id"])
        if kind == "json":
            body, content_type = transcript.as_json(record), "application/json"
        else:
            body, content_type = transcript.as_markdown(record, self.src.tz), "text/markdown"
        return web.Response(text=body, content_type=content_type, charset="utf-8",
                            headers={"Content-Disposition": f'attachment; filename="session-{name}.{kind}"'})

    # -- usage ----------------------------------------------------------------------
    async def storage(self, request: web.Request) -> web.StreamResponse:
        """``switchboard storage`` as a page: the same report and the same commands that reduce each line,
        measured on a reader thread at most once a minute (on a large store ``dbstat`` takes seconds)."""
        async with self._storage_lock:
            if self._storage is None or time.time() - self._storage[0] > STORAGE_FRESH_SECONDS:
                self._storage = (time.time(), report_json(await self.src.db.storage.report()))
        measured_at, report = self._storage
        smallest = SMALLEST_OBJECT_BYTES.get(report["engine"], 0)
        small = [o for o in report["objects"] if o["bytes"] is not None and o["bytes"] <= smallest]
        listed = [o for o in report["objects"] if o not in small]
        return self._render(request, "storage.html", "storage", report=report, size=size, shown=OBJECTS_SHOWN,
                            objects=listed, small=small, small_bytes=sum(o["bytes"] for o in small),
                            measured_at=measured_at, integrity=(self.src.health().get("integrity") or {}),
                            backup=self.src.health().get("backup"))

    async def budgets(self, request: web.Request, *, error: str = "", status: int = 200) -> web.StreamResponse:
        """Every budget rule in force with what its scope spent this period, what is left and when it
        resets; a rule's limit changed, the rule turned off, or what its scope spent forgotten (new
        rules come from the config or ``switchboard budgets set``, which check their scope)."""
        gate = self.src.budgets
        states = await gate.listing() if gate is not None else []
        rows = [s.as_dict() for s in states]
        if len(states) <= DELETED_SHARE_RULES:  # one ledger read per rule: shown for a page of rules
            for row, state in zip(rows, states, strict=True):
                row["deleted"] = await gate.deleted_share(state)
        assert self.ui is not None
        return self.ui.render(request, "budgets.html", {
            "page": "budgets", "states": rows, "error": error, "done": request.query.get("done", ""),
            "refreshed_at": gate.refreshed_at if gate is not None else None}, status=status)

    def _budget_rule(self, name: str):
        gate = self.src.budgets
        return next((r for r in gate.rules() if r.name == name), None) if gate is not None else None

    async def budget_set(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        name, off = str(form.get("name", "")), form.get("off") == "1"
        rule = self._budget_rule(name)
        if rule is None:
            return await self.budgets(request, status=404, error=f"no budget rule is named {name!r}: nothing changed")
        amount: float | None = None
        if not off:
            try:
                amount = float(str(form.get("limit", "")).replace(",", ""))
                if not 0 < amount < float("inf"):
                    raise ValueError
            except ValueError:
                return await self.budgets(request, status=400, error=(
                    f"the new limit of {name} must be a number above 0 (a cost, or tokens): nothing changed"))
        await self.src.db.budgets.set_rule(name, rule.scope, rule.period, rule.kind, amount, now=time.time())
        await self.src.budgets.refresh()  # this instance at once; the others within their refresh
        log.info("dashboard: budget %s %s", name, "turned off" if amount is None else f"set to {amount:g}")
        return redirect("/ui/budgets?" + urlencode({"done": f"{name}: {'off' if amount is None else f'{amount:g}'}"}))

    async def budget_reset(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        name = str(form.get("name", ""))
        rule = self._budget_rule(name)
        if rule is None:
            return await self.budgets(request, status=404, error=f"no budget rule is named {name!r}: nothing reset")
        period = period_key(rule.period, time.time(), self.src.tz)
        await self.src.db.budgets.reset(rule.scope, period)
        await self.src.budgets.refresh()  # this instance at once; the others within their refresh
        log.info("dashboard: budget spend of %s in %s reset", rule.scope, period)
        return redirect("/ui/budgets?" + urlencode({"done": f"{rule.scope}: spent in {period[2:]} reset"}))

    async def usage(self, request: web.Request) -> web.StreamResponse:
        """The insights of ``switchboard insights``: the chart of the days' tokens by purpose and cost per
        day, and one row per model, purpose, platform, day, user (an identity's accounts together) or chat."""
        q = request.query
        problems = []
        by = q.get("by", "model").strip().lower()
        if by not in USAGE_GROUPINGS:
            problems.append(f"unknown grouping {by!r} (one of {', '.join(USAGE_GROUPINGS)})")
            by = "model"
        try:
            days = int(q.get("days", "30"))
            if not 1 <= days <= USAGE_MAX_DAYS:
                raise ValueError
        except ValueError:
            problems.append(f"days must be a whole number from 1 to {USAGE_MAX_DAYS}")
            days = 30
        since, dates = window(days, time.time())
        db = self.src.db
        # by user: an identity's accounts are one row, a cron job's calls go by its name
        rename = account_names(self.src.identities, await db.cron.list_jobs()) if by == "user" else None
        limit = None if by == "day" else USAGE_TOP
        # with identities, every account is read: an identity's accounts add up before the ranking
        everyone = by == "user" and bool(self.src.identities)
        found = from_summary(await db.usage.summary(since, by, limit=None if everyone else limit), dates, rename,
                             limit)
        chart = daily_chart(from_summary(await db.usage.summary(since, "purpose"), dates),
                            from_summary(await db.usage.summary(since, "day"), dates))
        svg = Markup(usage_svg(chart, title=f"Last {days} days (UTC): tokens by purpose, cost per day"))  # usage_svg escapes every label
        rows = [*found.groups, *([found.others] if found.others else [])]
        return self._render(request, "usage.html", "usage", insights=found, rows=rows, by=by, days=days,
                            groupings=USAGE_GROUPINGS, chart=svg, problem="; ".join(problems))

    # -- cron -----------------------------------------------------------------------
    def _runs(self, runs: list[dict]) -> list[dict]:
        return [{**r, "line": run_status_line(r, self.src.tz)} for r in runs]

    async def cron(self, request: web.Request) -> web.StreamResponse:
        jobs = await self.src.db.cron.list_jobs()
        runs = await self.src.db.cron.list_runs(None, limit=HISTORY_LIMIT)
        return self._render(request, "cron.html", "cron", jobs=jobs, runs=self._runs(runs))

    async def cron_job(self, request: web.Request) -> web.StreamResponse:
        job = await self.src.db.cron.get_job(request.match_info["job_id"])
        if job is None:
            raise web.HTTPNotFound()
        runs = await self.src.db.cron.list_runs(job["id"], limit=HISTORY_LIMIT)
        started = request.query.get("started", "")
        return self._render(request, "cron_job.html", "cron", job=job, runs=self._runs(runs),
                            started=started if started.isdigit() else "", done=request.query.get("done", ""))

    async def runs_fragment(self, request: web.Request) -> web.StreamResponse:
        """The runs table alone (of one job, or of all), which the page refreshes while a run is running."""
        job_id = request.match_info.get("job_id")
        if job_id is not None and await self.src.db.cron.get_job(job_id) is None:
            raise web.HTTPNotFound()
        runs = await self.src.db.cron.list_runs(job_id, limit=HISTORY_LIMIT)
        return self._render(request, "_runs.html", "cron", runs=self._runs(runs))

    async def cron_action(self, request: web.Request) -> web.StreamResponse:
        job_id, action = request.match_info["job_id"], request.match_info["action"]
        actions = {"run": self.src.cron.start_job, "pause": self.src.cron.pause_job,
                   "resume": self.src.cron.resume_job}
        if action not in actions:
            raise web.HTTPNotFound()
        try:
            result = await actions[action](job_id)
        except state.CronJobNotFound:
            raise web.HTTPNotFound() from None
        log.info("dashboard: cron job %s: %s", job_id, "run started" if action == "run" else f"{action}d")
        where = f"/ui/cron/{quote(job_id, safe='')}"
        if action == "run":
            return redirect(f"{where}?started={result['id']}")
        return redirect(f"{where}?done={'paused' if action == 'pause' else 'resumed'}")

    # -- pairing --------------------------------------------------------------------
    async def pairing(self, request: web.Request, *, error: str = "", status: int = 200) -> web.StreamResponse:
        listing = await self.src.db.pairing.list()
        assert self.ui is not None
        return self.ui.render(request, "pairing.html", {
            "page": "pairing", "pending": listing["pending"], "approved": listing["approved"], "platforms": installed_platforms(),
            "error": error, "approved_now": request.query.get("approved", ""),
            "revoked_now": request.query.get("revoked", "")}, status=status)

    async def pairing_approve(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        platform, code = str(form.get("platform", "")).lower(), str(form.get("code", "")).strip()
        if platform not in installed_platforms() or not code:
            return await self.pairing(request, error=f"choose a platform ({', '.join(installed_platforms())}) and a code",
                                      status=400)
        try:
            user = await self.src.db.pairing.approve(platform, code)
        except state.PairingNotFound:
            return await self.pairing(request, status=404, error=(
                f"no pending {platform} pairing request has code {code!r} (codes expire after an hour); "
                "nothing was approved"))
        log.info("dashboard: approved %s user %s (pairing code)", platform, user["user_id"])
        return redirect("/ui/pairing?" + urlencode({"approved": f"{platform}:{user['user_id']}"}))

    async def pairing_revoke(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        platform, user_id = str(form.get("platform", "")).lower(), str(form.get("user_id", ""))
        if platform not in installed_platforms() or not user_id:
            return await self.pairing(request, error="choose an approved user to revoke", status=400)
        if not await self.src.db.pairing.revoke(platform, user_id):
            return await self.pairing(request, error=f"{platform} user {user_id} was not approved: nothing changed",
                                      status=404)
        log.info("dashboard: revoked %s user %s", platform, user_id)
        return redirect("/ui/pairing?" + urlencode({"revoked": f"{platform}:{user_id}"}))


def duration(seconds: float | None) -> str:
    seconds = int(seconds or 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"
