"""Approvals that bind the exact call: a tool marked ``approval: always | once_per_session`` runs only
after a person said yes to that very call.

How a turn waits (the design)
-----------------------------
A turn never holds a model call (or a lane) open while a person decides.  When the model asks for a
call that needs approval, the tool loop stops there (:meth:`ToolApprovals.check` returns a
:class:`PendingCall`): the turn stores what it produced so far (the assistant message with its tool
calls, the results of the calls before this one) and its reply is the request itself -- the tool and
its exact arguments, pretty-printed and cut to fit the platform, and what each answer does -- sent
with Approve/Deny buttons in the same message where the platform has them (a streamed reply's last
message gets them with its final edit).  The request is stored (``db.approvals``, status ``pending``) bound to the
SHA-256 of the canonical call (the tool's name and its arguments as canonical JSON).

The answer is an ordinary inbound message: ``/approve <id>`` or ``/deny <id>`` typed anywhere (the
terminal chat and the local API included), or a button press, which the adapters turn into the same
command from the presser.  It is checked (the chat the request was posted in; the session's own user
or one of ``tools.approvers``), decided once in the store (a second press finds it answered), and
then a *resume step* is queued in the session's lane (``SessionRouter.resume``): it runs exactly the
stored call -- the stored arguments, whose hash is checked again -- stores the result as that call's
tool message (placed right after the message that asked), and runs a new turn from there, so the model
continues its loop with the result.  A denial, or no answer within ``tools.approval_timeout``, stores
``error: ... denied`` as the result instead, and the model reads that.  Other arguments are another
call: another request.

After a restart the pending rows are still there, so the buttons and ``/approve`` still work and
nothing runs without its answer.  A call approved but cut off by a crash before its result was stored
is never run again: its result says it was interrupted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping

import state
from gateway.config import ToolsConfig
from gateway.errors import GatewayClosing
from gateway.tasks import spawn
from gateway.tools import ToolContext, ToolRegistry
from gateway.types import Button, ChatRef, ChatType, InboundMessage

if TYPE_CHECKING:  # pragma: no cover
    from gateway.commands import CommandContext
    from gateway.control import ChatControl

log = logging.getLogger(__name__)

SEPARATOR = "__"  # an MCP tool is offered as <server>__<tool>
# What the request may take of a message: the platform's message (or, with buttons, its button message:
# a Slack section holds 3,000) less 100, at most 3,800 (PlatformConfig.CAPABILITIES); the arguments are cut
# to fit, never the lines that say how to answer.
DEFAULT_FIT = 3800


def _model(platform: str):
    from gateway.config import platform_models

    return platform_models().get(platform)


def fit(platform: str) -> int:
    model = _model(platform)
    if model is None:
        return DEFAULT_FIT
    caps = model.CAPABILITIES
    return min(DEFAULT_FIT, (caps.button_message_length or caps.max_message_length) - 100)


def buttoned(platform: str) -> bool:
    """The request carries Approve/Deny buttons on ``platform`` (its CAPABILITIES.buttons)."""
    model = _model(platform)
    return model is not None and model.CAPABILITIES.buttons
SWEEP_AT_MOST_SECONDS = 30.0  # the timeout sweep looks again at least this often

DENIED = ("error: the user denied this call to {tool}; it was not run. Do not call it again unless the "
          "user asks for it.")
EXPIRED = ("error: nobody approved this call to {tool} within {minutes}; it was not run. Tell the user it "
           "needs their approval if it is still wanted.")
INTERRUPTED = ("error: this call to {tool} was approved, but the gateway stopped before its result came back; "
               "it may or may not have taken effect and it was not run again. Check before calling it again.")
MISMATCH = "error: the approved call to {tool} does not match what was approved; it was not run"
NOBODY = ("error: {tool} needs a person's approval before it runs, and nobody can answer here (a scheduled "
          "job or a background task); it was not run")


def canonical_call(tool: str, arguments: dict) -> tuple[str, str]:
    """(the arguments as canonical JSON, the SHA-256 of the call): keys sorted, no spaces, UTF-8."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    digest = hashlib.sha256(f"{tool}\n{canonical}".encode("utf-8")).hexdigest()
    return canonical, digest


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A call the tool loop stopped at: it waits for a person's answer."""

    id: str
    tool: str
    arguments: str  # canonical JSON
    call_hash: str
    tool_call_id: str | None
    policy: str
    text: str  # the request as the user reads it
    buttons: tuple[Button, ...]


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:g} minutes"
    return f"{seconds:g} seconds"


def request_text(approval_id: str, tool: str, canonical: str, digest: str, *, platform: str,
                 timeout: float) -> str:
    """The request: the tool, its exact arguments pretty-printed (cut to fit ``platform``), how to answer."""
    pretty = json.dumps(json.loads(canonical), indent=2, ensure_ascii=False, sort_keys=True)
    pretty = pretty.replace("```", "`\u200b``")  # the arguments cannot close the code block they are shown in
    head = f"Approval needed: **{tool}** wants to run with these arguments (request {approval_id}):"
    if buttoned(platform):  # the buttons come in this same message, under this text
        tail = (f"**Approve** runs exactly this call, once; **Deny** refuses it and the model is told "
                f"(or send /approve {approval_id} or /deny {approval_id}). "
                f"Unanswered, it is denied in {_duration(timeout)}.")
    else:
        tail = (f"Approve with /approve {approval_id} or deny with /deny {approval_id}. "
                f"Unanswered, it is denied in {_duration(timeout)}.")
    room = fit(platform) - len(head) - len(tail) - 120
    if len(pretty) > room:
        cut = len(pretty) - room
        pretty = (f"{pretty[:max(room, 0)]}\n… ({cut:,} more characters not shown; approving runs the whole call, "
                  f"sha256 {digest[:16]})")
    return f"{head}\n```json\n{pretty}\n```\n{tail}"


def buttons_for(approval_id: str) -> tuple[Button, ...]:
    return (Button("Approve", f"/approve {approval_id}", "primary"), Button("Deny", f"/deny {approval_id}", "danger"))


class ToolApprovals:
    """The approval gate of the tool loop, the ``/approve`` and ``/deny`` commands, and the timeout sweep."""

    def __init__(self, db: state.AsyncSessionDB, cfg: ToolsConfig, registry: ToolRegistry, *,
                 identities: Mapping[str, tuple[str, ...]] | None = None, agent: str = "main",
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.registry = registry
        self.agent = agent
        self.clock = clock
        self._wake = asyncio.Event()
        self._control: ChatControl | None = None  # given by start(): what the timeout sweep goes on with
        self._task: asyncio.Task | None = None
        self._mine: Callable[[str], bool] = lambda platform: True  # the platforms whose requests this process times out
        self.configure(cfg, identities or {})

    def configure(self, cfg: ToolsConfig, identities: Mapping[str, tuple[str, ...]]) -> None:
        """Take the policies, approvers and timeout of ``cfg`` (at start and on reload)."""
        self.cfg = cfg
        self.timeout = cfg.approval_timeout
        approvers: set[str] = set()
        for entry in cfg.approvers:
            approvers.update(identities.get(entry, ()) if entry in identities else (entry,))
        self.approvers = frozenset(approvers)

    def policy(self, name: str) -> str:
        """never | always | once_per_session for the tool offered as ``name``."""
        server, sep, tool = name.partition(SEPARATOR)
        server_cfg = self.cfg.mcp_servers.get(server) if sep else None
        return server_cfg.approval_for(tool) if server_cfg is not None else "never"

    # -- the tool loop's gate (gateway.turn.ApprovalGate) ------------------------------------
    async def check(self, ctx: ToolContext, call_id: str | None, name: str,
                    arguments: str | None) -> PendingCall | str | None:
        """None: run the call now; a text: the call's result, not run; a PendingCall: stop and ask."""
        policy = self.policy(name)
        if policy == "never":
            return None
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return None  # not run either way: the registry answers that the arguments are not JSON
        if not isinstance(args, dict):
            return None
        chat = ctx.extra.get("chat")
        if not ctx.session_id or chat is None or ctx.platform == "cron":
            return NOBODY.format(tool=name)
        if policy == "once_per_session" and await self.db.approvals.approved_once(ctx.session_id, name):
            return None
        try:
            canonical, digest = canonical_call(name, args)
        except ValueError:
            return None
        approval_id = secrets.token_hex(4)
        return PendingCall(approval_id, name, canonical, digest, call_id, policy,
                           request_text(approval_id, name, canonical, digest, platform=ctx.platform,
                                        timeout=self.timeout),
                           buttons_for(approval_id))

    async def requested(self, pending: PendingCall, ctx: ToolContext, after_message_id: int | None) -> None:
        """Store ``pending`` (its turn's messages are stored; ``after_message_id`` is the last of them)."""
        chat: ChatRef = ctx.extra["chat"]
        now = self.clock()
        await self.db.approvals.add({
            "id": pending.id, "session_id": ctx.session_id, "session_key": ctx.session_key,
            "platform": chat.platform, "chat_type": str(ctx.extra.get("chat_type") or "dm"),
            "chat_id": chat.chat_id, "thread_id": chat.thread_id, "user_id": ctx.user_id, "tool": pending.tool,
            "arguments": pending.arguments, "call_hash": pending.call_hash, "tool_call_id": pending.tool_call_id,
            "policy": pending.policy, "after_message_id": after_message_id, "requested_at": now,
            "expires_at": now + self.timeout,
        })
        log.info("tool call %s in session %s waits for approval (request %s, sha256 %s)", pending.tool,
                 ctx.session_id, pending.id, pending.call_hash[:16])
        self._wake.set()

    # -- /approve and /deny --------------------------------------------------------------
    async def approve_command(self, ctx: CommandContext) -> str:
        return await self.answer(ctx, approve=True)

    async def deny_command(self, ctx: CommandContext) -> str:
        return await self.answer(ctx, approve=False)

    async def answer(self, ctx: CommandContext, *, approve: bool) -> str:
        msg = ctx.ticket.msg
        verb = "approve" if approve else "deny"
        wanted = ctx.command.args.split()[0].lower() if ctx.command.args.split() else None
        if wanted is None:
            waiting = await self.db.approvals.pending_in_chat(msg.platform, msg.chat_id)
            if not waiting:
                return "Nothing here is waiting for approval."
            if len(waiting) > 1:
                listed = "; ".join(f"/{verb} {r['id']} ({r['tool']})" for r in waiting[:10])
                return f"{len(waiting)} requests wait for an answer; say which: {listed}"
            row: dict | None = waiting[0]
        else:
            row = await self.db.approvals.get(wanted)
            if row is not None and (row["platform"], row["chat_id"]) != (msg.platform, msg.chat_id):
                row = None  # another chat's request: not even its existence is told
        if row is None:
            return f"There is no approval request {wanted} in this chat."
        if row["status"] != "pending":
            return _already(row)
        if not self.may_answer(row, msg):
            log.info("%s:%s may not answer approval request %s (asked by %s)", msg.platform, msg.user_id,
                     row["id"], row["user_id"])
            return (f"Only the person who asked, or an approver, can answer request {row['id']} "
                    f"({row['tool']}); nothing changed.")
        by = f"{msg.platform}:{msg.user_id}"
        if ctx.control.closing:  # nothing is decided that could not go on
            return f"The gateway is restarting; answer request {row['id']} again in a moment (nothing changed)."
        if approve:
            decided = await self.db.approvals.decide(row["id"], "approved", by, now=self.clock())
            if decided is None:
                return _already(await self.db.approvals.get(row["id"]) or row)
            ack = f"Approved: running {row['tool']} (request {row['id']})."
            step = self._run_approved(decided)
        else:
            stored = await self.db.approvals.deny(row["id"], "denied", by, DENIED.format(tool=row["tool"]),
                                                  now=self.clock())
            if stored is None:
                return _already(await self.db.approvals.get(row["id"]) or row)
            ack = f"Denied: {row['tool']} was not run (request {row['id']})."
            step = _stored(stored)
        log.info("approval request %s (%s) %s by %s", row["id"], row["tool"], "approved" if approve else "denied", by)
        return await self._continue(ctx.control, row, step, ack, sink=ctx.ticket.sink)

    def may_answer(self, row: dict, msg: InboundMessage) -> bool:
        """The session's own user, or a configured approver."""
        if msg.user_id is None:
            return False
        return msg.user_id == row["user_id"] or f"{msg.platform}:{msg.user_id}" in self.approvers

    # -- resuming the turn ----------------------------------------------------------------
    def _run_approved(self, row: dict) -> Callable[[], Awaitable[int | None]]:
        async def step() -> int | None:
            try:
                canonical, digest = canonical_call(row["tool"], json.loads(row["arguments"]))
            except ValueError:
                canonical, digest = "", ""
            if canonical != row["arguments"] or digest != row["call_hash"]:
                log.error("approval request %s: the stored call does not match its hash; not run", row["id"])
                content = MISMATCH.format(tool=row["tool"])
            else:
                ctx = ToolContext(session_id=row["session_id"], session_key=row["session_key"],
                                  platform=row["platform"], user_id=row["user_id"], agent=self.agent)
                content = await self.registry.call(row["tool"], row["arguments"], ctx)
            return await self.db.approvals.store_result(row["id"], row["session_id"], content,
                                                        from_status="approved", to_status="done")
        return step

    async def _continue(self, control: ChatControl, row: dict, step: Callable[[], Awaitable[int | None]], ack: str,
                        *, sink=None) -> str:
        """Queue ``step`` and the turn after it in the session's lane; the continued answer (for a
        request/response source; a platform's chat is sent it by the turn), or "" once it was sent."""
        msg = InboundMessage(platform=row["platform"], chat_type=ChatType(row["chat_type"]), chat_id=row["chat_id"],
                             user_id=row["user_id"], text="", thread_id=row["thread_id"])
        chat_output = control.has_output(row["platform"])
        if chat_output:
            await control.deliver(msg.chat, ack, None)
        try:
            reply = await control.resume(row["session_key"], msg, row["session_id"], step, sink=sink)
        except GatewayClosing:  # the answer is stored; the model goes on from it with the next message
            log.info("approval request %s answered during shutdown; the turn goes on after the restart", row["id"])
            return "The gateway is restarting; your answer is saved and the conversation goes on from it."
        text = await reply
        return "" if chat_output else text

    # -- timeouts -------------------------------------------------------------------------
    async def start(self, control: ChatControl, *, daemon: bool = True, settle: bool = True) -> None:
        """Settle what a crash left (approved calls without a result: interrupted, never run again) and
        start the timeout sweep, which goes on with the chats through ``control``.  ``daemon`` False (``switchboard chat``, beside a running daemon): only
        the terminal's own requests are this process's to time out, and nothing is settled at start.
        ``settle`` False (a cluster: another instance may be running an approved call right now):
        approved calls are left as they are."""
        self._control = control
        self._mine = (lambda platform: platform != "cli") if daemon else (lambda platform: platform == "cli")
        for row in await self.db.approvals.interrupted() if daemon and settle else []:
            if not self._mine(row["platform"]):
                continue
            await self.db.approvals.store_result(row["id"], row["session_id"], INTERRUPTED.format(tool=row["tool"]),
                                                 from_status="approved", to_status="interrupted")
            log.warning("approval request %s (%s) was approved but its call was cut off by a restart; "
                        "it is not run again", row["id"], row["tool"])
        if self._task is None:
            self._task = spawn(self._sweep(), name="approvals:timeouts")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def expire_due(self) -> int:
        """Deny every request whose time ran out; the model reads the denial.  Returns how many."""
        control = self._control
        assert control is not None, "ToolApprovals.start() starts the sweep"
        count = 0
        for row in await self.db.approvals.expired(self.clock()):
            if not self._mine(row["platform"]):
                continue
            stored = await self.db.approvals.deny(row["id"], "expired", None,
                                                  EXPIRED.format(tool=row["tool"], minutes=_duration(self.timeout)),
                                                  now=self.clock())
            if stored is None:
                continue  # answered meanwhile
            count += 1
            log.info("approval request %s (%s) ran out unanswered; denied", row["id"], row["tool"])
            ack = (f"Request {row['id']} ({row['tool']}) was not answered within {_duration(self.timeout)}; "
                   f"it was denied.")
            spawn(self._continue(control, row, _stored(stored), ack), name=f"approvals:expired:{row['id']}")
        return count

    async def _sweep(self) -> None:
        while True:
            self._wake.clear()
            nxt = None
            try:
                await self.expire_due()
                nxt = await self.db.approvals.next_expiry()
            except state.StateError as exc:
                log.warning("approval timeouts not checked (%s); trying again shortly", exc)
            except Exception:  # the sweep goes on: a request must never wait past its time for good
                log.exception("approval timeouts not checked; trying again shortly")
            wait = SWEEP_AT_MOST_SECONDS if nxt is None else min(max(nxt - self.clock(), 0.05), SWEEP_AT_MOST_SECONDS)
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass


def _stored(message_id: int) -> Callable[[], Awaitable[int | None]]:
    async def step() -> int | None:
        return message_id
    return step


def _already(row: dict) -> str:
    how = {"approved": "approved", "done": "approved and run", "denied": "denied", "expired": "denied (no answer in time)",
           "interrupted": "approved, and cut off by a restart"}.get(row["status"], row["status"])
    return f"Request {row['id']} ({row['tool']}) was already answered: {how}."
