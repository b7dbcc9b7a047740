"""The fact store as the gateway uses it: scopes, search, remember (with dedup), correct, forget.

:class:`FactService` wraps an :class:`state.AsyncSessionDB`.  The numpy work
(encoding a fact, scoring candidates) runs on a worker thread so the event
loop never waits on it, and SQL runs on the store's threads.

Trust: a new fact starts at ``TRUST_NEW`` (0.5; 0.7 when the user asked the
model to store it); a near-duplicate confirms the stored fact instead
(``+TRUST_STEP``, at most 1.0, last-confirmed now); a fact the user
contradicts is multiplied by ``CONTRADICT_FACTOR`` (0.5) and, when a
correction replaces it, hidden behind the correction (``superseded_by``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import FactRefused
from gateway.memory.facts import scoring, text as _text
from gateway.memory.identity import identity_of
from state import AsyncSessionDB

log = logging.getLogger(__name__)

TRUST_NEW = 0.5
TRUST_TOLD = 0.7
TRUST_STEP = 0.1
CONTRADICT_FACTOR = 0.5
DUPLICATE_JACCARD = 0.7  # content words this alike: the same fact
DUPLICATE_COSINE = 0.92  # or HRR vectors this alike
MAX_FACT_CHARS = 500


@dataclass(frozen=True, slots=True)
class FactSettings:
    enabled: bool = True
    dimension: int = scoring.DEFAULT_DIM
    weights: scoring.Weights = field(default_factory=scoring.Weights)
    half_life_days: float = 90.0
    limit: int = 5
    prefetch: bool = True
    model: str | None = None  # extraction model; None: the main model
    extract_delay_seconds: float = 60.0

    @classmethod
    def from_config(cls, cfg) -> "FactSettings":
        f = cfg.facts
        return cls(enabled=f.enabled, dimension=f.dimension,
                   weights=scoring.Weights(fts=f.weights.fts, jaccard=f.weights.jaccard, hrr=f.weights.hrr),
                   half_life_days=f.half_life_days, limit=f.limit, prefetch=f.prefetch, model=f.model,
                   extract_delay_seconds=f.extract_delay_seconds)


@dataclass(frozen=True, slots=True)
class Remembered:
    fact_id: int
    status: str  # "added" | "confirmed"
    content: str


def user_scope(config, platform: str, user_id: str | None) -> str | None:
    """The owner of a user's facts: their identity name when linked, else ``platform:user_id``."""
    if user_id is None or user_id == "":
        return None
    name = identity_of(config.identities, platform, user_id)
    return name if name is not None else f"{platform}:{user_id}"


class FactService:
    def __init__(self, db: AsyncSessionDB, settings: FactSettings, *, clock=time.time):
        self.db = db
        self.settings = settings
        self.clock = clock

    # -- reading ---------------------------------------------------------------
    async def search(self, agent: str, scope: str, query: str, *, mode: str = "probe",
                     limit: int | None = None) -> list[scoring.ScoredFact]:
        if mode not in scoring.MODES:
            raise FactRefused(f"unknown mode {mode!r}; use one of {', '.join(scoring.MODES)}")
        limit = self._limit(limit)
        candidates = await self.db.facts.candidates(agent, scope, scoring.recall_terms(query, mode), limit=3 * limit)
        return await self._rank(query, candidates, mode, limit)

    async def search_for_prefetch(self, session_key: str, agent: str, scope: str, query: str) -> list[scoring.ScoredFact]:
        """:meth:`search` for a turn's prefetch: nothing when the chat turned prefetch off (``/facts off``),
        with that choice and the candidates read together (one store call per turn, not two)."""
        limit = self._limit(None)
        candidates = await self.db.facts.prefetch_candidates(session_key, self.settings.prefetch, agent, scope,
                                                            scoring.recall_terms(query, "probe"), limit=3 * limit)
        return await self._rank(query, candidates, "probe", limit)

    def _limit(self, limit: int | None) -> int:
        return max(1, min(int(limit or self.settings.limit), 50))

    async def _rank(self, query: str, candidates: list[dict], mode: str, limit: int) -> list[scoring.ScoredFact]:
        if not candidates:
            return []
        s = self.settings
        return await asyncio.to_thread(scoring.rank, query, candidates, mode=mode, weights=s.weights,
                                       half_life_days=s.half_life_days, now=self.clock(), dim=s.dimension, limit=limit)

    # -- writing ---------------------------------------------------------------
    async def remember(self, agent: str, scope: str, content: str, entities: list[str] | None = None, *,
                       session_id: str | None = None, trust: float = TRUST_NEW) -> Remembered:
        """Store ``content``, or confirm the stored fact it nearly duplicates."""
        content = _clean(content)
        ents = _text.entities_of(content, entities)
        vector, blob = await asyncio.to_thread(_encoded, content, ents, self.settings.dimension)
        twin = await self._near_duplicate(agent, scope, content, ents, vector)
        now = self.clock()
        if twin is not None:
            await self.db.facts.confirm(twin["id"], now=now, trust_step=TRUST_STEP)
            return Remembered(twin["id"], "confirmed", twin["content"])
        fact_id = await self.db.facts.add(agent, scope, content, ents, session_id=session_id, trust=trust, now=now,
                                         hrr=blob)
        return Remembered(fact_id, "added", content)

    async def _near_duplicate(self, agent: str, scope: str, content: str, ents: list[str], vector) -> dict | None:
        candidates = await self.db.facts.candidates(agent, scope, sorted(_text.token_set(content)), limit=20)
        if not candidates:
            return None
        return await asyncio.to_thread(_closest_twin, content, ents, vector, candidates, self.settings.dimension)

    async def owned(self, agent: str, scope: str, fact_id) -> dict:
        try:
            fid = int(fact_id)
        except (TypeError, ValueError):
            raise FactRefused(f"fact_id must be a number (the #id shown by a search), not {fact_id!r}") from None
        fact = await self.db.facts.get(fid)
        if fact is None or fact["agent"] != agent or fact["user_scope"] != scope:
            raise FactRefused(f"there is no fact #{fid} for this user; search first to get the id")
        return fact

    async def contradict(self, agent: str, scope: str, fact_id) -> dict:
        """The user said the fact is wrong: its trust is halved."""
        fact = await self.owned(agent, scope, fact_id)
        updated = await self.db.facts.contradict(fact["id"], factor=CONTRADICT_FACTOR)
        if updated is None:  # forgotten meanwhile
            raise FactRefused(f"there is no fact #{fact['id']} any more; search again to get the id")
        return updated

    async def correct(self, agent: str, scope: str, fact_id, content: str, entities: list[str] | None = None, *,
                      session_id: str | None = None) -> tuple[dict, Remembered]:
        """Replace a wrong fact: the old one loses trust and is hidden behind the new one."""
        old = await self.owned(agent, scope, fact_id)
        new = await self.remember(agent, scope, content, entities, session_id=session_id, trust=TRUST_TOLD)
        if new.fact_id == old["id"]:
            raise FactRefused(f"the correction says the same as fact #{old['id']}; nothing changed")
        updated = await self.db.facts.contradict(old["id"], factor=CONTRADICT_FACTOR, superseded_by=new.fact_id)
        if updated is None:  # forgotten meanwhile; the correction is kept
            raise FactRefused(f"fact #{old['id']} was forgotten meanwhile; the correction is kept as #{new.fact_id}")
        return updated, new

    async def forget(self, agent: str, scope: str, fact_id) -> None:
        fact = await self.owned(agent, scope, fact_id)
        await self.db.facts.delete(agent, scope, fact["id"])


def _encoded(content: str, ents: list[str], dim: int) -> tuple[Any, bytes]:
    """A fact's vector, and its bytes for the store (on a worker thread: hrr and numpy are imported here)."""
    from gateway.memory.facts import hrr

    vector = hrr.encode_fact(content, ents, dim)
    return vector, hrr.to_blob(vector)


def _closest_twin(content: str, ents: list[str], vector, candidates: list[dict], dim: int) -> dict | None:
    """The candidate that nearly duplicates the fact (content words this alike, or vectors), if any."""
    from gateway.memory.facts import hrr

    words = _text.token_set(content + " " + " ".join(ents))
    cos = hrr.cosine(scoring.candidate_vectors(candidates, dim), vector[None, :])
    best, best_sim = None, 0.0
    for c, sim in zip(candidates, cos, strict=True):
        jac = _text.jaccard(words, _text.token_set(c["content"] + " " + " ".join(c["entities"])))
        if (jac >= DUPLICATE_JACCARD or sim >= DUPLICATE_COSINE) and max(jac, float(sim)) > best_sim:
            best, best_sim = c, max(jac, float(sim))
    return best


def _clean(content: str) -> str:
    from gateway.memory.files import scan_content  # the memory tool's injection and hidden-character check

    text = " ".join(str(content or "").split())
    if not text:
        raise FactRefused("content is empty; say what the fact is")
    if len(text) > MAX_FACT_CHARS:
        raise FactRefused(f"a fact holds at most {MAX_FACT_CHARS} characters (this one has {len(text)}); "
                          "split it into shorter facts")
    why = scan_content(text)
    if why:
        raise FactRefused(f"not stored: {why}")
    return text


def render_facts(facts: list[scoring.ScoredFact], tz=None) -> str:
    import datetime as dt

    lines = []
    for f in facts:
        when = dt.datetime.fromtimestamp(f.confirmed_at, tz or dt.timezone.utc).strftime("%Y-%m-%d")
        lines.append(f"#{f.id} (trust {f.trust:.2f}, confirmed {when}) {f.content}")
    return "\n".join(lines)
