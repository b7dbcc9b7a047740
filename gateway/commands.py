"""Slash commands, parsed in the gateway so they are the same on every platform.

A command never reaches the model.  ``/help``, ``/status``, ``/title``,
``/sessions``, ``/usage`` and ``/stop`` answer at once, even while a turn runs; the
commands that change the session (``/new``, ``/reset``, ``/resume``,
``/compress``) run in the session's lane, after a running turn.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

import state
from gateway.budgets import left_line
from gateway.control import ChatControl, ChatLane, ChatTicket
from gateway.durations import time_ago
from gateway.insights import summarize, window
from gateway.keys import chat_of_key
from gateway.tools import ToolContext
from gateway.usage import CallContext

log = logging.getLogger(__name__)


_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]*)(?:@\S+)?(?:\s+(.*))?$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: str
    known: bool


@dataclass(frozen=True, slots=True)
class CommandSpec:
    name: str
    description: str
    usage: str
    runs_now: bool
    handler: Callable[["CommandContext"], Awaitable[str]]


@dataclass(slots=True)
class CommandContext:
    """What a command runs with: its message, the chat's narrow control surface, its lane, the commands."""

    command: Command
    ticket: ChatTicket
    control: ChatControl
    lane: ChatLane
    commands: "CommandSet"

    @property
    def db(self) -> state.AsyncSessionDB:
        return self.control.db

    @property
    def session_id(self) -> str:
        return self.ticket.session_id

    @property
    def user_id(self) -> str | None:
        return self.ticket.msg.user_id


class Compressing(Protocol):
    """What ``/compress`` needs (a :class:`gateway.compressing.Compressor`)."""

    async def compress_now(self, session_id: str, session_key: str, focus: str | None,
                           model: str | None = None) -> tuple[str, str]:
        """Returns (the session to continue in, the line for the user); ``model``: the chat's named model,
        whose context window the summary is sized for."""


class ToolListing(Protocol):
    """What ``/tools`` shows (a :class:`gateway.tools_mcp.McpTools`)."""

    def listing(self, ctx: ToolContext) -> list[tuple[str, str, str | None]]:
        """(name, one line of description, why it is unavailable now or None) for every tool offered in
        ``ctx``'s chat."""


class SigningOut(Protocol):
    """What ``/tools logout SERVER`` asks (a :class:`gateway.tools_mcp.signin.SignIns`)."""

    async def logout_command(self, name: str, platform: str, user_id: str | None) -> str:
        """Sign the asker (or, for an approver, the operator) out of server ``name``; the line for the user."""


class CommandSet:
    """The registry of slash commands; later features add theirs with :meth:`add`."""

    def __init__(self, compressor: Compressing | None = None, tools: ToolListing | None = None,
                 signins: SigningOut | None = None) -> None:
        self._specs: dict[str, CommandSpec] = {}
        self.compressor = compressor  # what /compress runs; None: compression is off
        self.tools = tools  # what /tools lists; None: the agent has no tools here
        self.signins = signins  # what /tools logout asks; None: no server signs in here

    def add(self, name: str, description: str, usage: str, handler, *, runs_now: bool = False) -> None:
        self._specs[name] = CommandSpec(name, description, usage, runs_now, handler)

    def menu(self) -> list[tuple[str, str]]:
        """(name, description) pairs for the platforms' native command menus."""
        return [(s.name, s.description) for s in self._specs.values()]

    def parse(self, text: str) -> Command | None:
        m = _COMMAND.match(text.strip())
        if not m:
            return None
        name = m.group(1).lower()
        return Command(name, (m.group(2) or "").strip(), name in self._specs)

    def runs_now(self, name: str) -> bool:
        spec = self._specs.get(name)
        return spec is None or spec.runs_now  # unknown commands just get a hint

    async def run(self, command: Command, ticket: ChatTicket, control: ChatControl, lane: ChatLane) -> str:
        spec = self._specs.get(command.name)
        if spec is None:
            return f"Unknown command /{command.name}. Send /help to see what I understand."
        return await spec.handler(CommandContext(command, ticket, control, lane, self))

    def help_text(self) -> str:
        lines = ["Commands:"]
        lines += [f"{s.usage} - {s.description}" for s in self._specs.values()]
        return "\n".join(lines)


def _ago(ts: float | None, now: float) -> str:
    return time_ago(ts, now, never="never")


def _label(session: dict) -> str:
    if session.get("title"):
        return f'"{session["title"]}"'
    preview = (session.get("preview") or "").strip().replace("\n", " ")
    return f"“{preview[:40]}”" if preview else "(untitled)"


# -- handlers -------------------------------------------------------------

async def cmd_help(ctx: CommandContext) -> str:
    return ctx.commands.help_text()


async def cmd_new(ctx: CommandContext) -> str:
    try:  # /new <title>: a title that cannot be used is refused before anything changes
        title = ctx.db.sanitize_title(ctx.command.args)
    except state.InvalidTitle as exc:
        return f"No new session started: the title is not valid ({exc})."
    holder = await ctx.db.titles.session(title) if title else None
    if title and holder is not None:
        return f"No new session started: {await _title_taken(ctx, title, holder['id'])}"
    old = ctx.session_id
    await ctx.db.sessions.end(old, "new_session")
    ctx.control.session_ended(old, ctx.lane.key)  # persistent memory: keep what matters, in the background
    await ctx.control.release_held(ctx.lane, old)
    new_id = await ctx.control.start_session(ctx.lane.key, ctx.ticket.msg)
    ctx.ticket.session_id = new_id
    ctx.lane.last_prompt_tokens = None
    named = ""
    if title:
        try:
            await ctx.db.titles.set(new_id, title)
            named = f' "{title}"'
        except state.TitleConflict as exc:  # taken in the meantime: the session starts untitled
            return (f"Started a new session, untitled: {await _title_taken(ctx, exc.title, exc.holder_session_id)} "
                    f"The previous one ({old}) is saved: /resume {old} to go back.")
    return f"Started a new session{named}. The previous one ({old}) is saved: /resume {old} to go back."


async def _title_taken(ctx: CommandContext, title: str, holder_id: str) -> str:
    """The line for a title already in use: the holder is named only when it is one of the user's own."""
    holder = await ctx.db.sessions.get(holder_id)
    if holder is not None and _owned_by(holder, ctx.ticket.msg):
        return f'The title "{title}" is already used by your session {holder_id}. Choose another.'
    return f'The title "{title}" is already taken. Choose another.'


def _owned_by(session: state.Session, msg) -> bool:
    return msg.user_id is not None and session.user_id == msg.user_id and session.source == msg.platform


async def cmd_title(ctx: CommandContext) -> str:
    if not ctx.command.args:
        title = await ctx.db.titles.get(ctx.session_id)
        return f"Session title: {title}" if title else "This session has no title. Set one with /title <name>."
    try:
        await ctx.db.titles.set(ctx.session_id, ctx.command.args)
    except state.TitleConflict as exc:
        return await _title_taken(ctx, exc.title, exc.holder_session_id)
    except state.StateError as exc:
        return f"Title not set: {exc}"
    title = await ctx.db.titles.get(ctx.session_id)
    if title is None:
        return "Session title cleared."
    return f"Session title set: {title}"


async def cmd_status(ctx: CommandContext) -> str:
    s = await ctx.db.sessions.get(ctx.session_id)
    if s is None:  # deleted meanwhile (sessions delete, prune)
        return "This session no longer exists; your next message starts a new one."
    context_length = ctx.control.context_length
    used = ctx.lane.last_prompt_tokens
    share = f"{used / context_length:.0%} of {context_length:,} tokens" if (used and context_length) else "not measured yet"
    title = s.title or "(untitled)"
    return (
        f"Session {s.id}\nTitle: {title}\nMessages: {s.message_count}\n"
        f"Tokens: {s.input_tokens:,} in, {s.output_tokens:,} out\n"
        f"Context used: {share}"
        + ("\nA reply is being written." if ctx.lane.current is not None or ctx.lane.busy else "")
    )


async def _own_sessions(ctx: CommandContext, limit: int = 10) -> list[dict]:
    msg = ctx.ticket.msg
    if msg.user_id is None:
        return []
    rows = await ctx.db.sessions.list_rich(source=msg.platform, limit=limit * 3, user_ids=[msg.user_id])
    return rows[:limit]


async def _find_own(ctx: CommandContext, ref: str) -> tuple[str | None, list[str]]:
    """The id of the one session of the user's that ``ref`` names, or None with the candidate ids
    when an id prefix fits several of theirs (see ``db.sessions.find_owned``)."""
    msg = ctx.ticket.msg
    if msg.user_id is None:
        return None, []
    return await ctx.db.sessions.find_owned(ref, source=msg.platform, user_ids=[msg.user_id])


async def cmd_sessions(ctx: CommandContext) -> str:
    rows = await _own_sessions(ctx)
    if not rows:
        return "You have no saved sessions yet."
    now = ctx.control.clock()
    lines = ["Your recent sessions:"]
    for r in rows:
        marker = " (current)" if r["id"] == ctx.session_id else ""
        lines.append(f"{_label(r)} · {_ago(r.get('last_active'), now)} · {r['id']}{marker}")
    lines.append("Switch with /resume <title or id>.")
    return "\n".join(lines)


async def cmd_resume(ctx: CommandContext) -> str:
    if not ctx.command.args:
        rows = [r for r in await _own_sessions(ctx) if r["id"] != ctx.session_id]
        if not rows:
            return "There is no other session to resume."
        now = ctx.control.clock()
        return "\n".join(["Resume one of these with /resume <title or id>:"] +
                         [f"{_label(r)} · {_ago(r.get('last_active'), now)} · {r['id']}" for r in rows])
    ref = ctx.command.args
    found, candidates = await _find_own(ctx, ref)
    if candidates:
        shown = ", ".join(candidates[:5])
        return f'More than one of your sessions matches "{ref}": {shown}. Give more of the id.'
    if found is None:
        return f'No session of yours matches "{ref}". /resume alone lists yours.'
    target = await ctx.db.sessions.compression_tip(found) or found
    session = await ctx.db.sessions.get(target)
    if session is None or not _owned_by(session, ctx.ticket.msg):
        target, session = found, await ctx.db.sessions.get(found)
    if session is None:  # deleted meanwhile (sessions delete, prune)
        return f'Session {found} no longer exists. /resume alone lists yours.'
    if target == ctx.session_id:
        return "That is the current session."
    await ctx.db.sessions.end(ctx.session_id, "switched")
    await ctx.control.release_held(ctx.lane, ctx.session_id)
    if session.ended_at is not None:
        await ctx.db.sessions.reopen(target)
    await ctx.db.routes.set(ctx.lane.key, target)
    ctx.ticket.session_id = target
    ctx.lane.last_prompt_tokens = None
    return f"Resumed {_label(session.as_dict())} ({target}, {session.message_count} messages)."


async def cmd_stop(ctx: CommandContext) -> str:
    if await ctx.control.stop_anywhere(ctx.lane.key, ctx.session_id):
        return "Stopping the current reply."
    return "Nothing is running."


async def cmd_stream(ctx: CommandContext) -> str:
    msg = ctx.ticket.msg
    choice = (ctx.command.args or "").strip().lower()
    if choice not in ("", "on", "off"):
        return "Usage: /stream (whether replies here show as they are written), /stream on, /stream off"
    if msg.platform == "cli":  # the terminal chat draws every answer as it is written (piped: whole)
        return "The terminal chat shows replies as they are written (piped, each answer comes whole); nothing to change."
    if msg.platform == "api":
        return 'On the local API a request chooses for itself: "stream": true streams its answer.'
    if ctx.control.streamed_output(msg.platform, msg.chat_type, "on") is None:
        return (f"Replies on {msg.platform} arrive whole: streaming is off for it in the config "
                f"(streaming.enabled, platforms.{msg.platform}.streaming.enabled).")
    if choice:
        await ctx.control.choose(ctx.lane, "stream", choice)
        return ("Replies here now show as they are written." if choice == "on"
                else "Replies here now arrive whole, once written.")
    on = ctx.control.streamed_output(msg.platform, msg.chat_type, await ctx.control.choice(ctx.lane, "stream")) is not None
    return (f"Replies here {'show as they are written' if on else 'arrive whole, once written'} "
            f"(/stream {'off' if on else 'on'} to change).")


async def cmd_voice(ctx: CommandContext) -> str:
    msg = ctx.ticket.msg
    choice = (ctx.command.args or "").strip().lower()
    if choice not in ("", "on", "off"):
        return "Usage: /voice (whether replies here also come as voice messages), /voice on, /voice off"
    why_not = ctx.control.speaks_on(msg.platform)
    if choice == "off" or (choice == "" and why_not is None):
        if choice:
            await ctx.control.choose(ctx.lane, "voice", "off")
            return "Replies here now come as text only."
        on = await ctx.control.choice(ctx.lane, "voice") == "on"
        return (f"Replies here come {'as text and as a voice message' if on else 'as text only'} "
                f"(/voice {'off' if on else 'on'} to change).")
    if why_not is not None:
        return f"Replies here cannot be spoken: {why_not}."
    await ctx.control.choose(ctx.lane, "voice", "on")
    return "Replies here now also come as a voice message, with their text beside it."


async def cmd_model(ctx: CommandContext) -> str:
    msg = ctx.ticket.msg
    names = ctx.control.models.available(msg.platform, msg.user_id, ctx.lane.key)
    name = (ctx.command.args or "").strip()
    if name:
        if name not in names:
            return f"There is no model {name!r} you can use here. Models here: {', '.join(names)}."
        await ctx.control.choose(ctx.lane, "model", name)
        return f"This chat now uses the model {name}."
    current = await ctx.control.chat_model(ctx.lane, msg)
    listed = ", ".join(f"{n} (current)" if n == current else n for n in names)
    return f"Models here: {listed}. /model NAME switches this chat to another."


async def cmd_usage(ctx: CommandContext) -> str:
    """The asker's own model calls (their sessions on this platform) of the last 7 and 30 days."""
    msg = ctx.ticket.msg
    if msg.user_id is None:
        return "Usage is counted per user, and this chat has no user id."
    lines = ["Your usage (the model calls made for your sessions here):"]
    for days in (7, 30):
        since, dates = window(days, ctx.control.clock())
        t = summarize(await ctx.db.usage.report(since, "day", platform=msg.platform, user_id=msg.user_id),
                      dates).total.totals
        lines.append(f"Last {days} days: {t.calls:,} call{'s' if t.calls != 1 else ''} · "
                     f"{t.input_tokens:,} uncached input tokens · {t.cached_input_tokens:,} cached input tokens · "
                     f"{t.output_tokens:,} output tokens · cost {t.cost_text()}")
    gate = ctx.control.budgets
    if gate is not None:  # what is left of each budget this user's calls count against
        call = CallContext("turn", ctx.session_id, msg.platform, chat_of_key(ctx.lane.key), msg.user_id)
        now = ctx.control.clock()
        lines += [left_line(s, gate.settings.tz, now) for s in await gate.states(await gate.scopes_of(call), now)]
    return "\n".join(lines)


async def cmd_compress(ctx: CommandContext) -> str:
    compressor = ctx.commands.compressor
    if compressor is None:
        return "Compression is turned off (compression.enabled is false)."
    model = await ctx.control.chat_model(ctx.lane, ctx.ticket.msg)
    session_id, text = await compressor.compress_now(ctx.session_id, ctx.lane.key, ctx.command.args or None, model)
    if session_id != ctx.session_id:
        ctx.ticket.session_id = session_id
        ctx.lane.last_prompt_tokens = None
    return text


TOOLS_SHOWN = 40  # /tools lists at most this many (a chat message has a size limit)


async def cmd_tools(ctx: CommandContext) -> str:
    word, _, rest = ctx.command.args.strip().partition(" ")
    if word.lower() == "logout":
        server = rest.strip()
        if not server:
            return "Say which server: /tools logout SERVER"
        if ctx.commands.signins is None:
            return "No tool server signs in here."
        return await ctx.commands.signins.logout_command(server, ctx.ticket.msg.platform, ctx.user_id)
    tools = ctx.commands.tools
    here = ToolContext(session_id=ctx.session_id, session_key=ctx.lane.key, platform=ctx.ticket.msg.platform,
                       user_id=ctx.user_id, agent=ctx.control.agent)
    listing = tools.listing(here) if tools is not None else []
    if not listing:
        return "I have no tools in this chat."
    lines = [f"Tools I may use in this chat ({len(listing)}):"]
    for name, description, unavailable in listing[:TOOLS_SHOWN]:
        note = f" (unavailable now: {unavailable})" if unavailable else ""
        lines.append(f"- {name}: {description}{note}" if description else f"- {name}{note}")
    if len(listing) > TOOLS_SHOWN:
        lines.append(f"... and {len(listing) - TOOLS_SHOWN} more")
    return "\n".join(lines)


def default_commands(compressor: Compressing | None = None, tools: ToolListing | None = None,
                     signins: SigningOut | None = None) -> CommandSet:
    commands = CommandSet(compressor, tools, signins)
    commands.add("help", "Show the commands", "/help", cmd_help, runs_now=True)
    commands.add("new", "Start a fresh session (the old one is kept), titled if a name is given", "/new [title]", cmd_new)
    commands.add("reset", "Same as /new", "/reset [title]", cmd_new)
    commands.add("title", "Show or set this session's title", "/title [name]", cmd_title, runs_now=True)
    commands.add("status", "Session id, title, messages, tokens, context used", "/status", cmd_status, runs_now=True)
    commands.add("resume", "Switch to one of your older sessions", "/resume [title|id]", cmd_resume)
    commands.add("sessions", "Your recent sessions", "/sessions", cmd_sessions, runs_now=True)
    commands.add("stop", "Cancel the reply being written", "/stop", cmd_stop, runs_now=True)
    commands.add("usage", "Your tokens and cost, last 7 and 30 days", "/usage", cmd_usage, runs_now=True)
    commands.add("compress", "Summarize the conversation so far and continue", "/compress [focus]", cmd_compress)
    commands.add("stream", "Show replies as they are written, or whole", "/stream [on|off]", cmd_stream,
                 runs_now=True)
    commands.add("voice", "Also send replies as voice messages, or not", "/voice [on|off]", cmd_voice,
                 runs_now=True)
    commands.add("model", "List the models this chat may use, or switch to one", "/model [name]", cmd_model,
                 runs_now=True)
    commands.add("tools", "The tools I may use in this chat; sign out of a tool server", "/tools [logout SERVER]",
                 cmd_tools, runs_now=True)
    return commands


