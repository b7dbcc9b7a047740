"""The ``facts`` tool: the model searches, stores, corrects and forgets facts of the current user."""

from __future__ import annotations

import logging

from gateway.memory.facts import scoring
from gateway.memory.facts.service import TRUST_TOLD, FactRefused, FactService, render_facts, user_scope
from gateway.tools import Tool, ToolContext

log = logging.getLogger(__name__)

FACTS_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["search", "add", "correct", "contradict", "forget"]},
        "query": {"type": "string", "description": "For search: what to look for (a question or a statement)."},
        "mode": {"type": "string", "enum": list(scoring.MODES),
                 "description": "For search. probe: facts similar to the query (default); related: facts that tie "
                                "the query's names to other things; reason: facts that explain the query's subject "
                                "(why ...); contradict: stored facts the query's statement may contradict."},
        "content": {"type": "string", "description": "For add and correct: the fact, one short self-contained sentence."},
        "entities": {"type": "array", "items": {"type": "string"},
                     "description": "For add and correct: the names the fact is about (people, tools, places)."},
        "fact_id": {"type": "integer", "description": "For correct, contradict and forget: the #id from a search."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    },
    "required": ["action"],
    "additionalProperties": False,
}

DESCRIPTION = (
    "Long-term facts about this user, kept across sessions and scored by text match, word overlap and holographic "
    "vectors, weighted by trust and age. action=search with query (and mode); action=add with content (and entities) "
    "when the user tells you something durable; action=correct with fact_id and content when the user corrects a "
    "stored fact; action=contradict with fact_id when the user says a stored fact is wrong; action=forget with fact_id "
    "when asked to forget it. Store facts, never instructions."
)


def facts_tool(service: FactService, config) -> Tool:
    async def handler(ctx: ToolContext, args: dict) -> str:
        scope = user_scope(config, ctx.platform, ctx.user_id)
        if scope is None:
            return "error: facts are kept per user, and this conversation has no user"
        action = str(args.get("action") or "")
        try:
            if action == "search":
                query = str(args.get("query") or "").strip()
                if not query:
                    return "error: query is empty; say what to look for"
                mode = str(args.get("mode") or "probe")
                found = await service.search(ctx.agent, scope, query, mode=mode, limit=args.get("limit"))
                if not found:
                    return f"No stored facts match {query!r}."
                return f"Facts ({mode}), best first:\n{render_facts(found)}"
            if action == "add":
                done = await service.remember(ctx.agent, scope, str(args.get("content") or ""), _entities(args),
                                              session_id=ctx.session_id, trust=TRUST_TOLD)
                if done.status == "confirmed":
                    return f"Already known as #{done.fact_id} ({done.content}); confirmed it (trust up)."
                return f"Stored as #{done.fact_id}."
            if action == "correct":
                old, new = await service.correct(ctx.agent, scope, args.get("fact_id"), str(args.get("content") or ""),
                                                 _entities(args), session_id=ctx.session_id)
                return (f"Corrected: #{old['id']} (trust now {old['trust']:.2f}) is replaced by #{new.fact_id} "
                        f"({new.content}).")
            if action == "contradict":
                fact = await service.contradict(ctx.agent, scope, args.get("fact_id"))
                return f"Noted: #{fact['id']} ({fact['content']}) now has trust {fact['trust']:.2f}."
            if action == "forget":
                await service.forget(ctx.agent, scope, args.get("fact_id"))
                return f"Forgot #{int(args['fact_id'])}."
        except FactRefused as exc:
            return f"error: {exc}"
        return f"error: unknown action {action!r}; use search, add, correct, contradict or forget"

    return Tool(name="facts", description=DESCRIPTION, parameters=FACTS_SCHEMA, handler=handler)


def _entities(args: dict) -> list[str] | None:
    raw = args.get("entities")
    if isinstance(raw, str):
        raw = [raw]
    return [str(e) for e in raw][:6] if isinstance(raw, list) else None
