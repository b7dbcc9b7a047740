"""Holographic fact memory: facts kept across sessions for each (agent, user).

    hrr.py       the vector algebra (bind, unbind, superpose) and a fact's encoding
    scoring.py   retrieval: FTS5 recall + Jaccard + HRR modes, times trust and decay
    service.py   FactService: search, remember (dedup), correct, contradict, forget
    extract.py   facts from an ended session, by the auxiliary model
    tool.py      the ``facts`` tool
    prefetch.py  the ``<memory-context>`` block for one model call

:class:`FactMemory` wires them into the daemon: the tool, a system prompt
block that explains them, the turn's prefetch hook, ``/facts [on|off]``, an
extraction when a reset or ``/new`` ends a session and when compression moves
a conversation to a new session (queued: background work after a delay, caught
up at the next start when the daemon stopped first), and a bounded drain at shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Sequence

from gateway.memory.facts.extract import Extraction, extract_session
from gateway.memory.facts.prefetch import make_prefetch, memory_context
from gateway.memory.facts.scoring import MODES, ScoredFact, Weights, rank
from gateway.memory.facts.service import FactRefused, FactService, FactSettings, Remembered, user_scope
from gateway.memory.facts.tool import facts_tool
from gateway.tasks import spawn
from state import AsyncSessionDB
from state.memory_fence import MEMORY_OPEN

log = logging.getLogger(__name__)

__all__ = [
    "MODES", "Extraction", "FactMemory", "FactRefused", "FactService", "FactSettings", "Remembered", "ScoredFact",
    "Weights", "extract_session", "facts_tool", "make_prefetch", "memory_context", "rank", "user_scope",
]

SWEEP_DAYS = 7  # at start, ended sessions this recent that were never extracted are queued
SWEEP_LIMIT = 200

PROMPT_BLOCK = (
    "## Fact memory\n"
    "Durable facts about this user are kept across sessions. Look them up with the `facts` tool (action=search; "
    "mode=related for what goes with a name, reason for why something was decided, contradict to check a statement "
    "against what is stored); store what the user tells you that will matter later (action=add), and fix facts the "
    f"user corrects (action=correct). Facts recalled for the user's message may follow it in a {MEMORY_OPEN} "
    "block: background from earlier sessions, not the user's words; never quote or repeat that block."
)


class FactMemory:
    def __init__(self, config, db: AsyncSessionDB, model, *, clock=time.time):
        self.config = config
        self.settings = FactSettings.from_config(config)
        self.service = FactService(db, self.settings, clock=clock)
        self.model = model
        self.prefetch = make_prefetch(self.service, config)
        self._queue: dict[str, tuple[float, list]] = {}  # session id -> (due on the loop's clock, wait for these)
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._current: asyncio.Task | None = None
        self.extracted: collections.deque[Extraction] = collections.deque(maxlen=100)  # the latest results

    def tool(self):
        return facts_tool(self.service, self.config)

    async def prompt_block(self, req, session_id: str) -> str | None:
        if not self.settings.enabled or user_scope(self.config, req.platform, req.user_id) is None:
            return None
        return PROMPT_BLOCK

    # -- /facts ---------------------------------------------------------------
    async def command(self, ctx) -> str:
        msg = ctx.ticket.msg
        scope = user_scope(self.config, msg.platform, msg.user_id)
        if scope is None:
            return "Facts are kept per user, and this message has no user."
        arg = ctx.command.args.strip().lower()
        key = ctx.lane.key
        if arg in ("on", "off"):
            await self.service.db.facts.set_prefetch(key, arg == "on", now=self.service.clock())
            return ("Fact recall is on for this chat: relevant facts go with each message to the model."
                    if arg == "on" else
                    "Fact recall is off for this chat: no stored facts go with your messages. The model can still "
                    "look facts up when it needs them; /facts on turns recall back on.")
        if arg:
            return "Usage: /facts (what is stored, and whether recall is on), /facts on, /facts off"
        agent = self.config.agent
        count = await self.service.db.facts.count(agent, scope)
        chosen = await self.service.db.facts.prefetch_enabled(key)
        on = self.settings.prefetch if chosen is None else chosen
        recent = await self.service.db.facts.list(agent, scope, limit=5)
        lines = [f"{count} fact(s) stored about you. Recall before each message is {'on' if on else 'off'} in this "
                 f"chat (/facts {'off' if on else 'on'} to change)."]
        lines += [f"#{f['id']} (trust {f['trust']:.2f}) {f['content']}" for f in recent]
        return "\n".join(lines)

    # -- extraction when a session ends --------------------------------------------
    # Ended sessions wait ``extract_delay_seconds`` in a queue (and for the memory flush or the turn that
    # compressed), then one worker extracts them one at a time: background work that never competes with
    # the user's next turns.  Sessions still queued at shutdown are found again at the next start.

    async def start(self, *, sweep: bool = True) -> None:
        """Start the extraction worker; ``sweep``: also queue recent ended sessions never extracted
        (the daemon does; short-lived processes such as ``switchboard chat`` do not)."""
        if not self.settings.enabled:
            return
        self._wake = asyncio.Event()
        self._worker = spawn(self._work(self._wake), name="facts-extractor")
        if not sweep:
            return
        now = self.service.clock()
        try:
            waiting = await self.service.db.facts.sessions_awaiting(since=now - SWEEP_DAYS * 86400, now=now,
                                                                    limit=SWEEP_LIMIT)
        except Exception:  # the sweep is a catch-up; new sessions are still extracted
            log.warning("could not list ended sessions awaiting fact extraction", exc_info=True)
            waiting = []
        for session_id in waiting:
            self.schedule_extraction(session_id)
        if waiting:
            log.info("%d ended session(s) queued for fact extraction", len(waiting))

    def schedule_extraction(self, session_id: str, session_key: str | None = None, *,
                            after: Sequence[asyncio.Future | None] | None = None) -> None:
        """Queue ``session_id`` for extraction once ``after`` (the memory flush, the compressing turn) is done."""
        if not self.settings.enabled or self._wake is None or session_id in self._queue:
            return
        due = asyncio.get_running_loop().time() + self.settings.extract_delay_seconds
        self._queue[session_id] = (due, [w for w in after or () if w is not None])
        self._wake.set()

    def on_session_end(self, memory_hook):
        """The router's session-end hook: ``memory_hook`` first (its flush), then the extraction."""

        def hook(session_id: str, session_key: str) -> None:
            flush = memory_hook(session_id, session_key) if memory_hook is not None else None
            self.schedule_extraction(session_id, session_key,
                                     after=[flush] if isinstance(flush, asyncio.Future) else None)

        return hook

    def on_compressed(self, session_id: str, session_key: str) -> None:
        """The compressor's after-split hook: a compression that ends a session queues its extraction
        (after the turn that compressed)."""
        self.schedule_extraction(session_id, session_key, after=[asyncio.current_task()])

    async def _work(self, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            due = [sid for sid, (at, _w) in self._queue.items() if at <= now]
            if not due:
                wake.clear()
                wait = min((at for at, _w in self._queue.values()), default=now + 3600) - now
                try:
                    await asyncio.wait_for(wake.wait(), timeout=max(0.0, wait))
                except asyncio.TimeoutError:
                    pass
                continue
            for session_id in due:
                _at, waits = self._queue[session_id]
                if waits:
                    await asyncio.wait(waits, timeout=self.config.model.timeout_seconds)
                self._current = asyncio.create_task(
                    extract_session(self.service, self.model, self.config, session_id,
                                    model_name=self.settings.model, default_agent=self.config.agent),
                    name=f"facts-extract:{session_id}")
                try:
                    result = await asyncio.shield(self._current)
                    self.extracted.append(result)
                except asyncio.CancelledError:
                    raise
                except Exception:  # one session's failure never stops the others
                    log.exception("fact extraction for %s failed", session_id)
                finally:
                    self._queue.pop(session_id, None)
                    self._current = None

    async def drain(self, timeout: float) -> None:
        """At shutdown: a running extraction finishes within ``timeout``; queued ones wait for the next start."""
        worker, current = self._worker, self._current
        self._worker = None
        if worker is None:
            return
        worker.cancel()
        if current is not None and not current.done():
            _done, pending = await asyncio.wait([current], timeout=timeout)
            for task in pending:
                task.cancel()
                log.warning("fact extraction cancelled at shutdown; it runs again at the next start")
                await asyncio.wait([task], timeout=5)
        await asyncio.wait([worker], timeout=5)
        if self._queue:
            log.info("%d ended session(s) left for fact extraction at the next start", len(self._queue))
