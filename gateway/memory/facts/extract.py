"""Facts extracted when a session ends (reset, ``/new``, compression), by the auxiliary model.

:func:`extract_session` shows the model the ended session's conversation and
the user's stored facts that it touches (with their ids), and asks for JSON::

    {"facts": [{"text": "...", "entities": ["..."]}], "contradicted": [12, 40]}

New facts go through :meth:`FactService.remember`, so a near-duplicate
confirms the stored fact (trust up, last-confirmed now) instead of adding a
second copy; ``contradicted`` ids (only ones that were shown) lose trust.  A
session is extracted once: the first process to claim it in ``state.db``
does it; a failed attempt gives the claim back.  Cron sessions, sessions
without a user and short sessions are skipped.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

from gateway.errors import BudgetExceeded, ModelUnavailable
from gateway.memory.facts import text as _text
from gateway.memory.facts.service import FactRefused, FactService, user_scope
from gateway.usage import for_session

log = logging.getLogger(__name__)

MIN_MESSAGES = 4  # user + assistant messages a session needs before it is worth extracting
MAX_TRANSCRIPT_CHARS = 16_000
MAX_FACTS = 20
KNOWN_SHOWN = 20

EXTRACT_PROMPT = """You maintain long-term facts about a user, kept across conversations.
Read the conversation you are given and list the durable facts worth knowing in later conversations: the user's
preferences, decisions (with their reasons), plans, names of people, projects, tools and places, and what they
use. Skip small talk, one-off requests, anything temporary, and anything the assistant merely suggested.
Each fact: one short self-contained sentence in the third person ("The user ..."), with the names it is about.
If the conversation shows that a stored fact is no longer true, put its id in "contradicted" and state the new fact.
Answer with JSON only, no prose:
{"facts": [{"text": "...", "entities": ["..."]}], "contradicted": []}"""

EXTRACT_INPUT = """Facts already stored (id: text):
{known}

Conversation:
{transcript}"""


@dataclass(frozen=True, slots=True)
class Extraction:
    session_id: str
    skipped: str | None = None  # why nothing was done
    added: int = 0
    confirmed: int = 0
    contradicted: int = 0


def _agent_of(session_key: str | None, default: str) -> str:
    parts = (session_key or "").split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "agent" and parts[1] else default


def transcript_of(history: list[dict], limit: int = MAX_TRANSCRIPT_CHARS) -> str:
    lines = []
    for m in history:
        if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
            continue
        lines.append(f"{m['role'].upper()}: {m['content'].strip()}")
    text = "\n".join(lines)
    return text if len(text) <= limit else "[... earlier part left out ...]\n" + text[-limit:]


def parse_reply(reply: str) -> tuple[list[dict], list[int]]:
    """The facts and contradicted ids of the model's answer; raises ValueError when it holds no JSON object."""
    m = re.search(r"\{.*\}", reply or "", re.DOTALL)
    if not m:
        raise ValueError("the answer holds no JSON object")
    data = json.loads(m.group(0))
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    facts = []
    for item in data.get("facts") or []:
        if isinstance(item, str):
            item = {"text": item}
        if isinstance(item, dict) and str(item.get("text") or "").strip():
            ents = item.get("entities")
            facts.append({"text": str(item["text"]).strip(),
                          "entities": [str(e) for e in ents] if isinstance(ents, list) else None})
    ids = []
    for raw in data.get("contradicted") or []:
        try:
            ids.append(int(raw))
        except (TypeError, ValueError):
            continue
    return facts[:MAX_FACTS], ids


async def extract_session(service: FactService, model, config, session_id: str, *, model_name: str | None = None,
                          default_agent: str = "main") -> Extraction:
    """Extract the facts of the ended session ``session_id`` (see the module docstring)."""
    db = service.db
    session = await db.sessions.get(session_id)
    if session is None:
        return Extraction(session_id, skipped="no such session")
    key = session.session_key or ""
    if session.source == "cron" or ":cron:" in key:
        return Extraction(session_id, skipped="cron session")
    scope = user_scope(config, session.source or "", session.user_id)
    if scope is None:
        return Extraction(session_id, skipped="no user")
    history = await db.messages.as_conversation(session_id)
    if len([m for m in history if m.get("role") in ("user", "assistant")]) < MIN_MESSAGES:
        return Extraction(session_id, skipped="too short")
    if not await db.facts.claim_extraction(session_id, now=service.clock()):
        return Extraction(session_id, skipped="already extracted")
    agent = _agent_of(key, default_agent)
    try:
        user_words = " ".join(m["content"] for m in history if m.get("role") == "user" and isinstance(m.get("content"), str))
        known = await db.facts.candidates(agent, scope, sorted(_text.token_set(user_words)), limit=KNOWN_SHOWN)
        known_text = "\n".join(f"{k['id']}: {k['content']}" for k in known) or "(none)"
        messages = [{"role": "system", "content": EXTRACT_PROMPT},
                    {"role": "user", "content": EXTRACT_INPUT.format(known=known_text, transcript=transcript_of(history))}]
        completion = await model.complete(messages, model=model_name, purpose=for_session(
            "fact_extraction", session_id, key, platform=session.source, user_id=session.user_id,
            agent=agent))
        facts, contradicted = parse_reply(completion.message.get("content") or "")
    except (ModelUnavailable, BudgetExceeded, ValueError) as exc:
        await db.facts.release_extraction(session_id)
        log.warning("fact extraction for session %s failed: %s; nothing stored (it runs again if the session "
                    "is resumed and ends again)", session_id, exc)
        return Extraction(session_id, skipped=f"failed: {exc}")
    except BaseException:
        await db.facts.release_extraction(session_id)
        raise
    added = confirmed = hit = 0
    shown = {k["id"] for k in known}
    for fact_id in contradicted:
        if fact_id in shown:
            await service.contradict(agent, scope, fact_id)
            hit += 1
    for fact in facts:
        try:
            done = await service.remember(agent, scope, fact["text"], fact["entities"], session_id=session_id)
        except FactRefused as exc:
            log.info("extracted fact refused for session %s: %s", session_id, exc)
            continue
        if done.status == "added":
            added += 1
        else:
            confirmed += 1
    await db.facts.finish_extraction(session_id, added=added, confirmed=confirmed)
    log.info("facts from session %s: %d added, %d confirmed, %d contradicted", session_id, added, confirmed, hit)
    return Extraction(session_id, added=added, confirmed=confirmed, contradicted=hit)
