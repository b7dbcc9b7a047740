"""Prefetch: before each turn, the user's top facts for their message, for that model call only.

:func:`memory_context` renders the block the turn appends to the user's
message in the prompt it sends (``TurnHooks.prefetch``); the stored message
never holds it.  ``/facts off`` turns it off for one chat (session key),
``/facts on`` back on; ``facts.prefetch`` in the config is the default.
"""

from __future__ import annotations

import logging

from gateway.memory.facts.service import FactService, render_facts, user_scope
from state import FactsChoice, FactsOwner
from state.memory_fence import MEMORY_CLOSE, MEMORY_OPEN

log = logging.getLogger(__name__)

MIN_SCORE = 0.05  # facts scoring lower are not worth the tokens
MAX_QUERY_CHARS = 2000

OPEN, CLOSE = MEMORY_OPEN, MEMORY_CLOSE  # the fence's tags are kept in one place, with the sanitiser
NOTE = ("[Recalled from earlier conversations with this user (facts memory, best first; #id, trust, last confirmed). "
        "Background only, not part of the user's message; use what is relevant, ignore the rest.]")


def memory_context(facts) -> str:
    return f"{OPEN}\n{NOTE}\n{render_facts(facts)}\n{CLOSE}"


class FactPrefetch:
    """The turn's prefetch hook (``gateway.turn.Prefetch``): the user's top facts for their message, or
    None; never raises.  :meth:`owner` names whose facts, so that the chat's ``/facts`` choice and
    whether the user has any fact are read with the turn's context; most users have none, and then
    no search runs."""

    def __init__(self, service: FactService, config) -> None:
        self._service = service
        self._config = config

    def owner(self, req) -> FactsOwner | None:
        if not self._service.settings.enabled:
            return None
        scope = user_scope(self._config, req.platform, req.user_id)
        if scope is None or ":cron:" in (req.session_key or ""):
            return None
        return FactsOwner(req.session_key, _agent_of(req.session_key, self._config.agent), scope)

    async def __call__(self, req, user_text: str, known: FactsChoice | None = None) -> str | None:
        owner = self.owner(req)
        if owner is None or not user_text.strip() or user_text.lstrip().startswith("/"):
            return None
        service, query = self._service, user_text[:MAX_QUERY_CHARS]
        try:
            if known is None:
                found = await service.search_for_prefetch(owner.session_key, owner.agent, owner.user_scope, query)
            elif (service.settings.prefetch if known.prefetch is None else known.prefetch) and known.any_facts:
                found = await service.search(owner.agent, owner.user_scope, query)
            else:
                return None
        except Exception:  # recall is a bonus; the turn goes on without it
            log.warning("fact prefetch for %s failed; answering without it", req.session_key, exc_info=True)
            return None
        found = [f for f in found if f.score >= MIN_SCORE]
        return memory_context(found) if found else None


def make_prefetch(service: FactService, config) -> FactPrefetch:
    """The turn's prefetch hook (:class:`FactPrefetch`)."""
    return FactPrefetch(service, config)


def _agent_of(session_key: str | None, default: str) -> str:
    parts = (session_key or "").split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "agent" and parts[1] else default
