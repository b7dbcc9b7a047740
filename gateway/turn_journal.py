"""The journal of a turn's tool calls, so a call that acts on the world never runs twice.

Before each call and after it, a turn that answers stored messages journals what it produced so far and
which call is running (``state._toolcalls``).  The turn that answers the same messages after a crash
starts from that journal: the call that was running is never run again, the model reads that it was cut
off (as that call's tool message, :data:`INTERRUPTED`) and may ask for it again.  The one exception is a
call that was waiting for the user's answer to its server's question, which can be sent again with
that answer (``resume``: gateway.tools_mcp.resume): its result is then what the model reads.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Awaitable, Callable, Protocol, cast

from state import AsyncSessionDB

log = logging.getLogger(__name__)

INTERRUPTED = ("error: this call was cut off: the gateway stopped while it ran, so whether it took effect is "
               "unknown, and it was not run again. Call the tool again if it is still needed.")
NOT_RUN = ("error: this call was not run: the gateway stopped during an earlier call of the same step. "
           "Call the tool again if it is still needed.")
#: :meth:`TurnJournal.resumed`'s default: the journal is read from the store then.
READ_NOW = object()


class ToolJournal(Protocol):
    """Where a tool loop records what it produced and which call runs (:class:`TurnJournal`)."""

    async def write(self, produced: list[dict], running: str | None) -> None: ...


class TurnJournal:
    """The journal of the turn answering the stored messages ``answered`` (see the module's docstring),
    kept under the last of them."""

    def __init__(self, db: AsyncSessionDB, answered: tuple[int, ...], session_id: str, clock) -> None:
        self.db, self.answered, self.session_id = db, list(answered), session_id
        self.message_id = max(answered)
        self._clock = clock or time.time
        self.written = False

    async def resumed(self, newest: dict | None | object = READ_NOW,
                      resume: Callable[[dict], Awaitable[str | None]] | None = None) -> list[dict]:
        """What a run of this turn cut off by a crash produced, each call in it answered: the one that was
        running with :data:`INTERRUPTED` (or with what ``resume`` gives for it, when not None), any after
        it in the same step with :data:`NOT_RUN`.  ``newest``: the journal's entry as read with the turn's
        context (None: there is none); by default read now."""
        entry = await self.db.tool_journal.newest(self.answered) if newest is READ_NOW else cast("dict | None", newest)
        if entry is None:
            return []
        self.written = True
        produced = json.loads(entry["produced"])
        answered = {m.get("tool_call_id") for m in produced if m.get("role") == "tool"}
        steps = [m for m in produced if m.get("role") == "assistant" and m.get("tool_calls")]
        went_on = False
        for call in steps[-1]["tool_calls"] if steps else []:
            if call.get("id") in answered:
                continue
            name = call.get("function", {}).get("name")
            text = NOT_RUN
            if call.get("id") == entry["running"]:
                got = await resume(call) if resume is not None else None
                went_on = got is not None
                text = got if got is not None else INTERRUPTED
            produced.append({"role": "tool", "tool_call_id": call.get("id"), "name": name, "content": text})
        if went_on:  # journaled at once: another run of this turn (a crash, or a retry) takes the result
            await self.write(produced, None)
        elif entry["running"] is not None:
            log.warning("a tool call cut off by a stop (%s) is not run again; the model is told", entry["running"])
        return produced

    async def write(self, produced: list[dict], running: str | None) -> None:
        await self.db.tool_journal.save(self.message_id, self.session_id, json.dumps(produced, ensure_ascii=False),
                                        running, now=self._clock())
        self.written = True

    async def drop(self) -> None:
        await self.db.tool_journal.drop(self.answered)
