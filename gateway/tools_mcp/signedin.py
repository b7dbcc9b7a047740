"""The tool call that needed a sign-in, run again once the callback lands, and the turn going on.

    calls = SignedInCalls(db, registry, approvals, mcp, agent="main")
    SignIns(..., signed_in=calls)              # gateway.tools_mcp.signin
    waiting = calls.waiting(asking)            # kept (sealed) with the sign-in's flow
    go = await calls.prepared(waiting, principal)    # at the callback: None, or
    await go(control)                                # the call and the turn after it, queued

A call of a server the asker has not signed in to answers the model "the user must authorise X
first" and sends the link; the flow keeps that exact call (the tool, its arguments as the model
wrote them, the session and the chat it was asked in, and who asked).  Once the callback signs that
same person in, the call is queued in the session's lane (as an approved call is): it runs with the
asker's own sign-in, stored as the agent's call and its result, and a turn goes on from there, so the
model answers with the result in the chat.  Nothing is widened: the principal signed in must be the
one the call runs as, the tool must still be offered in that chat, and a tool that needs approval
(``approval: always``, or ``once_per_session`` not yet given) is not run again but asked for anew by
the user (the chat is told to ask again).  The flow is taken once, so the call runs at most once.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol

import state
from gateway.tasks import spawn
from gateway.tools import ToolContext, ToolRegistry
from gateway.tools_mcp.server import SEPARATOR, Asking, McpServer
from gateway.types import ChatRef, ChatType, InboundMessage

if TYPE_CHECKING:  # pragma: no cover
    from gateway.approvals import ToolApprovals
    from gateway.control import ChatControl

log = logging.getLogger(__name__)

AUTHORISE = "authorise"  # gateway.tools_mcp.manager's tool that only sends the link: nothing to run again


class Servers(Protocol):
    """The configured servers by name (gateway.tools_mcp.manager.McpTools)."""

    @property
    def servers(self) -> Mapping[str, McpServer]: ...


class SignedInCalls:
    def __init__(self, db: state.AsyncSessionDB, registry: ToolRegistry, approvals: ToolApprovals | None,
                 mcp: Servers | None = None, *, agent: str) -> None:
        self.db, self.registry, self.approvals, self.mcp, self.agent = db, registry, approvals, mcp, agent

    def waiting(self, asking: Asking) -> dict | None:
        """What the flow keeps of ``asking``'s call (None: nothing to run again, e.g. the authorise tool)."""
        ctx = asking.context
        chat: ChatRef | None = (getattr(ctx, "extra", None) or {}).get("chat")
        if ctx is None or chat is None or not ctx.session_id or asking.tool.endswith(SEPARATOR + AUTHORISE):
            return None
        return {"tool": asking.tool, "arguments": asking.arguments, "session_id": ctx.session_id,
                "session_key": ctx.session_key, "platform": ctx.platform, "user_id": ctx.user_id,
                "chat_type": str(getattr(ctx.extra.get("chat_type"), "value", ctx.extra.get("chat_type")) or "dm"),
                "chat": [chat.platform, chat.chat_id, chat.thread_id]}

    async def prepared(self, waiting: dict, principal: str) -> Callable[[ChatControl], Awaitable[None]] | None:
        """What queues the waiting call and the turn after it; None when it may not run again."""
        name = waiting["tool"]
        platform, chat_id, thread_id = waiting["chat"]
        chat = ChatRef(platform, chat_id, thread_id)
        ctx = ToolContext(session_id=waiting["session_id"], session_key=waiting["session_key"],
                          platform=waiting["platform"], user_id=waiting["user_id"], agent=self.agent,
                          extra={"chat": chat, "chat_type": ChatType(waiting["chat_type"])})
        if not self._runs_as(name, ctx, principal) or name not in self.registry.offered(ctx):
            log.warning("the call of %s that waited for a sign-in is not run again: not this sign-in's, or "
                        "no longer offered there", name)
            return None
        arguments = _json(waiting["arguments"])
        call_id = "call_" + secrets.token_hex(8)
        if self.approvals is not None and await self.approvals.check(ctx, call_id, name, arguments) is not None:
            return None  # it needs a person's yes (again): the user asks again, and is asked
        msg = InboundMessage(platform=chat.platform, chat_type=ChatType(waiting["chat_type"]), chat_id=chat.chat_id,
                             user_id=waiting["user_id"], text="", thread_id=chat.thread_id)

        async def step() -> int | None:
            content = await self.registry.call(name, arguments, ctx)
            ids = await self.db.messages.append_many(ctx.session_id, [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "content": content, "tool_call_id": call_id, "tool_name": name}])
            log.info("%s ran again once its sign-in was done; the turn goes on", name)
            return ids[-1]

        async def go(control: ChatControl) -> None:
            reply = await control.resume(waiting["session_key"], msg, ctx.session_id, step)
            spawn(_settled(reply), name=f"mcp:signed-in:{name}")
        return go

    def _runs_as(self, name: str, ctx: ToolContext, principal: str) -> bool:
        """The call would run with the sign-in just made (the asker's own, or the operator's)."""
        if self.mcp is None:
            return False
        server = self.mcp.servers.get(name.partition(SEPARATOR)[0])
        return server is not None and server.auth is not None and server.principal_for(ctx) == principal


def _json(arguments: Any) -> str:
    import json

    return json.dumps(arguments, ensure_ascii=False)


async def _settled(reply: Any) -> None:
    await reply  # the chat is sent the turn's answer by the turn itself
