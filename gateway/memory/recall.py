"""Cross-session recall: the ``session_search`` tool and the ``/search`` command.

The retrieval path, with the transcripts cut around their matches::

    query --FTS5, within the user's scope, minus the current lineage--> ~50 hits
          --group by session, most hits first--> top 3 (at most 5) sessions
          --load, format, cut to ~100,000 characters around the matches-->
          --summarize each with the query in mind (3 at once, 90 s in all)-->
          titles, dates, platforms and summaries (or the matching snippets)

An empty query lists the user's recent sessions without calling the model.
The scope (:func:`gateway.memory.identity.recall_scope`) keeps a user to their own
sessions of this agent (all their linked accounts); the operator sees all.

    recall = SessionRecall(db, model, RecallSettings(model="small-model"))
    found = await recall.search("docker restart", scope, current_session_id=sid)
    text = recall.render("docker restart", found)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from dataclasses import dataclass, replace
from zoneinfo import ZoneInfo

from gateway.errors import ModelUnavailable
from gateway.memory.identity import Scope, recall_scope
from gateway.memory.truncation import truncate_around_matches
from gateway.tools import Tool, ToolContext
from gateway.usage import OTHER, CallContext, for_session
from state import AsyncSessionDB

log = logging.getLogger(__name__)

__all__ = [
    "RecallSettings",
    "RecalledSession",
    "SessionRecall",
    "SUMMARY_PROMPT",
    "format_conversation",
    "search_command",
    "session_search_tool",
]

ROLES = ("user", "assistant", "tool", "system")
TOOL_RESULT_CHARS = 4_000  # a tool's output in the recalled text; the rest is rarely what was discussed

SUMMARY_SYSTEM = "You summarize past conversations for an assistant that needs to recall them. Be factual and specific."

SUMMARY_PROMPT = """Summarize this conversation excerpt.
Focus on content related to: {query}

Requirements:
- Use past tense (this conversation already happened)
- Preserve specific details: names, numbers, commands, file paths, URLs
- Focus on the search topic, skip unrelated parts
- Keep the summary under 300 words
- Structure: what was discussed -> what was decided -> what was the outcome

Conversation ({title}, {date}, on {platform}):
{text}"""


@dataclass(frozen=True, slots=True)
class RecallSettings:
    model: str | None = None  # the summarizer; None: the chat model
    hit_limit: int = 50  # FTS hits gathered before grouping
    default_sessions: int = 3
    max_sessions: int = 5
    window_chars: int = 100_000
    max_concurrent: int = 3  # summaries in flight at once, per search
    timeout_seconds: float = 90.0  # every summary of one search together
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class RecalledSession:
    """One earlier session a search found."""

    session_id: str
    title: str | None
    started_at: float | None
    platform: str
    hits: int
    snippets: tuple[str, ...]
    text: str = ""  # the truncated conversation the summarizer reads
    summary: str | None = None  # None: the summarizer failed or ran out of time


def format_conversation(messages: list[dict]) -> str:
    """A stored session as plain text, one ``[ROLE]: ...`` block per message."""
    lines = []
    for m in messages:
        role = (m.get("role") or "?").upper()
        content = m.get("content") or ""
        if m.get("role") == "tool":
            name = m.get("tool_name") or "tool"
            if len(content) > TOOL_RESULT_CHARS:
                content = content[:TOOL_RESULT_CHARS] + " [... output cut ...]"
            lines.append(f"[TOOL {name}]: {content}")
            continue
        if content:
            lines.append(f"[{role}]: {content}")
        calls = m.get("tool_calls")
        if calls:
            for call in _calls(calls):
                fn = call.get("function") or {}
                lines.append(f"[{role} called {fn.get('name', '?')}]: {fn.get('arguments', '')}")
    return "\n\n".join(lines)


def _calls(raw) -> list[dict]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


class SessionRecall:
    def __init__(self, db: AsyncSessionDB, model, settings: RecallSettings = RecallSettings()):
        self.db = db
        self.model = model
        self.settings = settings
        self._tz = ZoneInfo(settings.timezone)

    # -- the pipeline ------------------------------------------------------------
    async def gather(self, query: str, scope: Scope, *, current_session_id: str | None = None,
                     role_filter: list[str] | None = None, limit: int | None = None) -> list[RecalledSession]:
        """Recall, group, load and truncate: everything before the summarizer (no model call)."""
        s = self.settings
        wanted = max(1, min(limit or s.default_sessions, s.max_sessions))
        if scope.accounts is not None and not scope.accounts:
            return []
        found = await self.db.recall.hits(
            query, agent_prefix=scope.agent_prefix, accounts=scope.accounts,
            exclude_lineage_of=current_session_id, role_filter=role_filter, limit=s.hit_limit,
        )
        # one group per conversation: a compressed conversation's sessions count together
        groups: dict[str, list[dict]] = {}
        for hit in found["hits"]:
            groups.setdefault(hit.get("conversation") or hit["session_id"], []).append(hit)
        # most hits first; ties go to the group holding the better-ranked hit (dicts keep hit order)
        top = sorted(groups, key=lambda root: -len(groups[root]))[:wanted]
        if not top:
            return []
        members = {root: list(dict.fromkeys(h["session_id"] for h in groups[root])) for root in top}
        rows = {row["id"]: row for row in await self.db.recall.sessions([m for root in top for m in members[root]])}

        def cut() -> list[RecalledSession]:
            out = []
            for root in top:
                parts = sorted((rows[m] for m in members[root] if m in rows),
                               key=lambda r: (r.get("started_at") or 0, r["id"]))
                if not parts:
                    continue
                text = "\n\n[... the conversation was compressed here and continued ...]\n\n".join(
                    format_conversation(p["messages"]) for p in parts)
                latest, hits = parts[-1], groups[root]
                out.append(RecalledSession(
                    session_id=latest["id"], title=latest.get("title") or parts[0].get("title"),
                    started_at=parts[0].get("started_at"), platform=latest.get("source") or "?", hits=len(hits),
                    snippets=tuple(h.get("snippet") or "" for h in hits[:5]),
                    text=truncate_around_matches(text, query, s.window_chars),
                ))
            return out

        return await asyncio.to_thread(cut)  # formatting and cutting megabytes is CPU work: off the loop

    async def summarize(self, query: str, found: list[RecalledSession],
                        purpose: CallContext = OTHER) -> list[RecalledSession]:
        """Summarize each session (``max_concurrent`` at once, ``timeout_seconds`` for all);
        a session whose summary failed or ran late keeps ``summary=None``.  ``purpose``: the session
        and user the summaries are made for (the usage ledger's ``recall`` rows)."""
        if not found:
            return []
        slots = asyncio.Semaphore(self.settings.max_concurrent)

        async def one(item: RecalledSession) -> str | None:
            async with slots:
                prompt = SUMMARY_PROMPT.format(query=query, title=_title(item), date=self._date(item.started_at),
                                               platform=item.platform, text=item.text)
                try:
                    completion = await self.model.complete(
                        [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": prompt}],
                        model=self.settings.model, purpose=purpose,
                    )
                except ModelUnavailable as exc:
                    log.warning("recall summary of %s failed (%s); returning its snippets", item.session_id, exc)
                    return None
                return (completion.message.get("content") or "").strip() or None

        tasks = [asyncio.create_task(one(item), name=f"recall-summary:{item.session_id}") for item in found]
        try:
            done, pending = await asyncio.wait(tasks, timeout=self.settings.timeout_seconds)
        except asyncio.CancelledError:  # the turn was stopped: stop asking for summaries too
            for task in tasks:
                task.cancel()
            raise
        for task in pending:
            task.cancel()
        if pending:
            log.warning("recall: %d of %d summaries not done within %.0fs; returning their snippets",
                        len(pending), len(tasks), self.settings.timeout_seconds)
            await asyncio.wait(pending)
        out = []
        for item, task in zip(found, tasks, strict=True):
            summary = None
            if task in done and not task.cancelled():
                if task.exception() is not None:
                    log.warning("recall summary of %s failed: %s", item.session_id, task.exception())
                else:
                    summary = task.result()
            out.append(replace(item, summary=summary, text=""))
        return out

    async def search(self, query: str, scope: Scope, *, current_session_id: str | None = None,
                     role_filter: list[str] | None = None, limit: int | None = None,
                     purpose: CallContext = OTHER) -> list[RecalledSession]:
        found = await self.gather(query, scope, current_session_id=current_session_id,
                                  role_filter=role_filter, limit=limit)
        return await self.summarize(query, found, purpose)

    async def recent(self, scope: Scope, *, current_session_id: str | None = None, limit: int = 5) -> list[dict]:
        if scope.accounts is not None and not scope.accounts:
            return []
        return await self.db.recall.recent_sessions(agent_prefix=scope.agent_prefix, accounts=scope.accounts,
                                             exclude_lineage_of=current_session_id, limit=limit)

    # -- answers -------------------------------------------------------------------
    def _date(self, ts: float | None) -> str:
        if not ts:
            return "unknown date"
        return f"{dt.datetime.fromtimestamp(ts, self._tz):%d %b %Y %H:%M}"

    def render(self, query: str, found: list[RecalledSession]) -> str:
        if not found:
            return (f'No earlier conversation matches "{query}". Try other words, fewer words, '
                    "or a prefix like deploy*.")
        lines = [f'Earlier conversations about "{query}" ({len(found)}):']
        for n, item in enumerate(found, 1):
            lines.append("")
            lines.append(f"{n}. {_title(item)} · {self._date(item.started_at)} · {item.platform} "
                         f"· session {item.session_id} · {item.hits} matching message{'s' * (item.hits != 1)}")
            if item.summary:
                lines.append(item.summary)
            else:
                lines.append("(No summary available; the matching lines:)")
                lines += [f"- {snip}" for snip in item.snippets if snip]
        return "\n".join(lines)

    def render_recent(self, rows: list[dict]) -> str:
        if not rows:
            return "There are no earlier sessions to show."
        lines = ["Recent sessions:"]
        for n, r in enumerate(rows, 1):
            preview = (r.get("preview") or "").strip().replace("\n", " ")
            preview = f" · “{preview[:80]}”" if preview else ""
            label = f'"{r["title"]}"' if r.get("title") else "(untitled)"
            when = self._date(r.get("last_active") or r.get("started_at"))
            lines.append(f"{n}. {label} · {when} · {r.get('source')} · {r.get('message_count') or 0} messages"
                         f" · session {r['id']}{preview}")
        return "\n".join(lines)


def _title(item: RecalledSession) -> str:
    return f'"{item.title}"' if item.title else "(untitled)"


def _roles(raw) -> list[str]:
    if raw in (None, ""):
        return []
    parts = raw if isinstance(raw, list) else str(raw).split(",")
    roles = [str(p).strip().lower() for p in parts if str(p).strip()]
    bad = [r for r in roles if r not in ROLES]
    if bad:
        raise ValueError(f"unknown role(s) {', '.join(bad)}; role_filter takes a comma-separated list of {', '.join(ROLES)}")
    return roles


def _limit(raw, settings: RecallSettings) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return settings.default_sessions
    return max(1, min(value, settings.max_sessions))


SESSION_SEARCH_SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": (
            "Keywords to find in earlier conversations: words, \"exact phrases\", OR/AND/NOT, prefix*. "
            "Empty: list the user's recent sessions.")},
        "role_filter": {"type": "string", "description": "Optional comma-separated roles to search: user, assistant, tool."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 5, "description": "How many sessions (default 3, at most 5)."},
    },
    "additionalProperties": False,
}


def session_search_tool(recall: SessionRecall, config) -> Tool:
    """The ``session_search`` tool, scoped to the caller's identity on ``config``."""

    async def handler(ctx: ToolContext, args: dict) -> str:
        query = str(args.get("query") or "").strip()
        try:
            roles = _roles(args.get("role_filter"))
        except ValueError as exc:
            return f"error: {exc}"
        scope = recall_scope(config, ctx.agent, ctx.platform, ctx.user_id)
        if not query:
            rows = await recall.recent(scope, current_session_id=ctx.session_id)
            return recall.render_recent(rows)
        found = await recall.search(query, scope, current_session_id=ctx.session_id, role_filter=roles,
                                    limit=_limit(args.get("limit"), recall.settings),
                                    purpose=for_session("recall", ctx.session_id, ctx.session_key,
                                                        platform=ctx.platform, user_id=ctx.user_id, agent=ctx.agent))
        return recall.render(query, found)

    return Tool(
        name="session_search",
        description=(
            "Search the user's earlier conversations (other sessions, on any of their linked platforms) "
            "and get a summary of what was discussed in each matching one. Use it when the user refers to "
            "something from before (\"like we discussed last week\"). The current conversation is not searched."
        ),
        parameters=SESSION_SEARCH_SCHEMA,
        handler=handler,
    )


def search_command(recall: SessionRecall, config):
    """The ``/search <query>`` handler: the same recall, answered to the user directly."""

    async def cmd_search(ctx) -> str:
        msg = ctx.ticket.msg
        scope = recall_scope(config, config.agent, msg.platform, msg.user_id)
        query = ctx.command.args.strip()
        if not query:
            rows = await recall.recent(scope, current_session_id=ctx.session_id)
            return recall.render_recent(rows) + "\n\nSearch them with /search <words>."
        found = await recall.search(query, scope, current_session_id=ctx.session_id,
                                    purpose=for_session("recall", ctx.session_id, ctx.ticket.session_key,
                                                        platform=msg.platform, user_id=msg.user_id))
        return recall.render(query, found)

    return cmd_search
