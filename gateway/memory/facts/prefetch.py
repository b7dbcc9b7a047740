"""Prefetch: before each turn, the user's top facts for their message, for that model call only.

:func:`memory_context` renders the block the turn appends to the user's
message in the prompt it sends (``TurnHooks.prefetch``); the stored message
never holds it.  ``/facts off`` turns it off for one chat (session key),
``/facts on`` back on; ``facts.prefetch`` in the config is the default.
"""

from __future__ import annotations

import logging

from gateway.memory.facts.service import FactService, render_facts, user_scope
from state.memory_fence import MEMORY_CLOSE, MEMORY_OPEN

log = logging.getLogger(__name__)

MIN_SCORE = 0.05  # facts scoring lower are not worth the tokens
MAX_QUERY_CHARS = 2000

OPEN, CLOSE = MEMORY_OPEN, MEMORY_CLOSE  # the fence's tags are kept in one place, with the sanitiser
NOTE = ("[Recalled from earlier conversations with this user (facts memory, best first; #id, trust, last confirmed). "
        "Background only, not part of the user's message; use what is relevant, ignore the rest.]")


def memory_context(facts) -> str:
    return f"{OPEN}\n{NOTE}\n{render_facts(facts)}\n{CLOSE}"


def make_prefetch(service: FactService, config):
    """The turn's prefetch hook: ``async (request, user_text) -> block | None``; never raises."""

    async def prefetch(req, user_text: str) -> str | None:
        if not service.settings.enabled or not user_text.strip() or user_text.lstrip().startswith("/"):
            return None
        scope = user_scope(config, req.platform, req.user_id)
        if scope is None or ":cron:" in (req.session_key or ""):
            return None
        try:
            agent = _agent_of(req.session_key, config.agent)
            found = await service.search_for_prefetch(req.session_key, agent, scope, user_text[:MAX_QUERY_CHARS])
        except Exception:  # recall is a bonus; the turn goes on without it
            log.warning("fact prefetch for %s failed; answering without it", req.session_key, exc_info=True)
            return None
        found = [f for f in found if f.score >= MIN_SCORE]
        return memory_context(found) if found else None

    return prefetch


def _agent_of(session_key: str | None, default: str) -> str:
    parts = (session_key or "").split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "agent" and parts[1] else default
