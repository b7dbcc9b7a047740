"""A tool call cut off by a restart while its server's question waited, sent again with the answer.

    resume = CallResumer(questions, mcp)       # TurnHooks(resume_call=resume)
    text = await resume(ctx, call, only)       # the call's result, or None: it stays cut off

The crash journal (gateway.turn_journal) knows which of the model's calls was running when the
gateway stopped; the resumed turn asks this for it.  It goes on only for a call whose last round is a
2026-07-28 server's question (stored with what sending it again needs, gateway.tools_mcp.rounds):
bound to the exact call (the model's call id in the same session, the same tool and arguments), still
offered in that chat, and never sent with its answers before (``db.questions.resend``, once).  Then
the answer is taken (or waited for, gateway.tools_mcp.questions), the call goes to the server again
with it, and what the server returns is that call's result, as the turn would have had it.  Anything
else (a legacy server's question, a call changed or no longer allowed) stays cut off: None, and the
model is told so by the journal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Callable

from gateway.tools_mcp.rounds import Round
from gateway.tools_mcp.server import SEPARATOR, Asking, McpServer

if TYPE_CHECKING:  # pragma: no cover
    from gateway.tools import ToolContext
    from gateway.tools_mcp.manager import McpTools
    from gateway.tools_mcp.questions import ToolQuestions

log = logging.getLogger(__name__)

READY_SECONDS = 30.0  # a call sent again waits at most this for its server to be connected


class CallResumer:
    def __init__(self, questions: ToolQuestions, mcp: McpTools, *, clock: Callable[[], float] = time.time) -> None:
        self.questions, self.mcp, self.clock = questions, mcp, clock

    async def __call__(self, ctx: ToolContext, call: dict, only: set[str] | None) -> str | None:
        db = self.questions.db
        call_id, fn = call.get("id"), call.get("function") or {}
        name = fn.get("name") or ""
        if not call_id or not ctx.session_id:
            return None
        rounds = await db.questions.rounds_of_call(ctx.session_id, call_id)
        rows = await db.questions.of_round(rounds[-1]) if rounds else []
        if not rows or rows[0]["retry"] is None or rows[0]["resent_at"] is not None:
            return None  # no question, a legacy server's, or one whose answers were sent already
        stored = json.loads(rows[0]["retry"])
        round_ = Round.from_dict(stored["round"])
        server = self.mcp.servers.get(name.partition(SEPARATOR)[0])
        if server is None or not _same_call(round_, stored, rows, name, fn.get("arguments")):
            log.warning("a call cut off while its question waited (%s) is not the one stored; not sent again", name)
            await self.questions.cut_off(rows)
            return None
        await _ready(server)
        if name not in self.mcp.registry.offered(ctx, only):
            log.warning("%s is no longer offered in this chat; its call cut off by a restart is not sent again", name)
            await self.questions.cut_off(rows)
            return None
        call_ctx = dataclasses.replace(ctx, extra={**ctx.extra, "tool_call_id": call_id})
        asking = Asking(name, dict(round_.arguments), call_ctx, round_, stored["key"])
        log.info("%s: the call cut off by a restart while its question waited goes on", name)
        answer = await self.questions.resumed_answer(asking, rows)
        if not await db.questions.resend(round_.round_id, now=self.clock()):
            return None  # another run of this turn sent it meanwhile
        return await server.call(round_.tool, dict(round_.arguments), call_ctx, seed=(round_, {stored["key"]: answer}))


def _same_call(round_: Round, stored: dict, rows: list[dict], name: str, arguments: str | None) -> bool:
    """The stored round is of the model's call as journaled: its tool and arguments, one input request."""
    try:
        asked = json.loads(arguments or "{}")
    except ValueError:
        return False
    return (rows[0]["tool"] == name and name.partition(SEPARATOR)[2] == round_.tool and asked == round_.arguments
            and round_.keys == (stored["key"],))


async def _ready(server: McpServer) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while not server.available and server.state != "stopped" and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
