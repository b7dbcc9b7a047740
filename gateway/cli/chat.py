"""``switchboard chat``: the agent in a terminal, through the same router as every platform.

The session key is ``agent:<agent>:cli:dm:<login>``.  A plain ``chat`` starts a
new session; ``-c`` continues the most recently active of this terminal's
sessions (or the newest of a title's lineage), ``-r`` resumes by id, prefix or
title.  A prefix or a title names terminal sessions only; another surface's
session (an API user's, a Telegram chat's) is continued only when given by its
whole id.  On resume a recap panel shows where the conversation stood.

The answer streams into the terminal as the model writes it (a rich Live): a
spinner until the first text (with a running tool's status line beside it),
then the newest lines of the text; once the answer is done it is printed
whole, in place of the live view.
"""

from __future__ import annotations

import asyncio
import getpass
import json

from rich.console import Console, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.spinner import Spinner
from rich.text import Text

from gateway.config import Config
from gateway.errors import SwitchboardError
from gateway.router import SessionRouter
from gateway.runtime.daemon import local_gateway
from gateway.types import ChatType, InboundMessage

RECAP_EXCHANGES = 10
USER_CHARS = 300
ASSISTANT_CHARS = 200
ASSISTANT_LINES = 3


REFRESH_PER_SECOND = 12
THINKING = "thinking…"


class LiveAnswer:
    """The answer as the model writes it, for a rich Live (a :class:`~gateway.turn.ReplySink`)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._text = ""
        self._spinner = Spinner("dots", text=Text(THINKING, style="dim"), style="dim")

    def feed(self, delta: str) -> None:
        self._text += delta

    def show_status(self, line: str) -> None:
        self._spinner.update(text=Text(line, style="dim"))

    def discard_text(self) -> None:
        self._text = ""  # it was not the answer: a tool call followed

    def __rich__(self) -> RenderableType:
        """A spinner until the first text; then as many of the text's last lines as the terminal shows."""
        if not self._text:
            return self._spinner
        width, height = self._console.size
        rows = max(1, height - 2)
        tail = self._text[-rows * width * 2:]  # enough to fill the screen, so a long answer is not re-wrapped whole
        lines = Text(tail).wrap(self._console, width)
        return Text("\n").join(lines[-rows:])


def _cut(text: str, chars: int, lines: int | None = None) -> str:
    text = (text or "").strip()
    if lines is not None:
        kept = text.splitlines()
        if len(kept) > lines:
            text = "\n".join(kept[:lines]) + " …"
    return text if len(text) <= chars else text[:chars].rstrip() + " …"


def recap(messages: list[dict]) -> Text:
    """The recap panel's body: the last exchanges, user in gold, assistant in green, tool calls collapsed."""
    shown = [m for m in messages if m["role"] in ("user", "assistant")]
    user_turns = [i for i, m in enumerate(shown) if m["role"] == "user"]
    start = user_turns[-RECAP_EXCHANGES] if len(user_turns) > RECAP_EXCHANGES else 0
    body = Text(style="dim")
    if start:
        body.append(f"... {start} earlier messages ...\n\n", style="dim italic")
    for m in shown[start:]:
        if m["role"] == "user":
            body.append("● You: ", style="bold gold1")
            body.append(_cut(m.get("content") or "", USER_CHARS) + "\n")
            continue
        calls = m.get("tool_calls") or []
        if isinstance(calls, str):
            calls = json.loads(calls)
        if calls:
            names = ", ".join(c.get("function", {}).get("name", "?") for c in calls)
            body.append(f"  [{len(calls)} tool call{'s' if len(calls) != 1 else ''}: {names}]\n", style="dim")
        if m.get("content"):
            body.append("◆ Agent: ", style="bold green")
            body.append(_cut(m["content"], ASSISTANT_CHARS, ASSISTANT_LINES) + "\n")
    return body


async def _terminal_session(db, ref: str) -> str:
    """The session ``ref`` names (an id, a prefix or a title, the newest of its lineage).

    A whole id may name any surface's session (the operator asked for that one);
    a prefix or a title names only terminal sessions (source ``cli``), so an API
    user's or a platform chat's conversation is never continued by accident.
    """
    if await db.get_session(ref) is not None:
        return ref
    target = await db.resolve_session_id(ref)
    session = await db.get_session(target) or {}
    if session.get("source") != "cli":
        raise SwitchboardError(
            f"{ref!r} names a {session.get('source')} session ({target}), not one of this terminal's; "
            f"to continue it here anyway, give its whole id: switchboard chat -r {target}"
        )
    return target


async def _pick_session(router: SessionRouter, key: str, continue_: str | None, resume: str | None) -> str | None:
    """Point ``key`` at the session to continue; None when this chat starts a new one."""
    db = router.db
    if resume:
        target = await _terminal_session(db, resume)
    elif continue_:
        target = await _terminal_session(db, continue_)
    elif continue_ is not None:
        rows = await db.list_sessions_rich(source="cli", session_key=key, limit=1)
        if not rows:
            return None
        target = rows[0]["id"]
    else:
        await _start_fresh(router, key)
        return None
    target = await db.get_compression_tip(target) or target
    session = await db.get_session(target)
    if session.get("ended_at") is not None:
        await db.reopen_session(target)
    await db.set_route(key, target)
    return target


async def _start_fresh(router: SessionRouter, key: str) -> None:
    """A plain ``switchboard chat``: the terminal's open session ends (saved, as with /new); the first
    message starts a new one."""
    db = router.db
    routed = await db.get_routed_session(key)
    if routed is None:
        return
    if routed.get("ended_at") is None:
        await db.end_session(routed["id"], "new_session")
        router.session_ended(routed["id"], key)
    await db.delete_route(key)


async def run_chat(config: Config, *, continue_: str | None = None, resume: str | None = None,
                   console: Console | None = None, read_line=None) -> None:
    console = console or Console()
    read_line = read_line or (lambda: input("› "))
    async with local_gateway(config) as gateway:
        assert gateway.router is not None
        await _converse(gateway.router, console, read_line, continue_, resume)


async def _converse(router: SessionRouter, console: Console, read_line, continue_: str | None,
                    resume: str | None) -> None:
    db = router.db
    login = getpass.getuser()
    probe = InboundMessage(platform="cli", chat_type=ChatType.DM, chat_id=login, user_id=login, text="")
    key = router.key_for(probe)
    resumed = await _pick_session(router, key, continue_, resume)
    if continue_ == "" and not resume and resumed is None:
        console.print("[dim]No earlier terminal session to continue: this is a new one.[/dim]")
    if resumed:
        session = await db.get_session(resumed)
        title = session.get("title") or resumed
        console.print(Panel(recap(await db.get_messages(resumed)), title=f"Previous conversation: {title}",
                            border_style="dim"))
    console.print("[dim]Type a message; /help for commands; Ctrl-D to leave.[/dim]")
    while True:
        try:
            line = await asyncio.to_thread(read_line)
        except EOFError:
            break
        if not line.strip():
            continue
        msg = InboundMessage(platform="cli", chat_type=ChatType.DM, chat_id=login, user_id=login,
                             user_name=login, text=line)
        answer = LiveAnswer(console)
        ticket = await router.handle(msg, sink=answer)
        if ticket is None:
            continue
        if ticket.reply.done():  # a command, answered at once
            reply = ticket.reply.result()
        else:
            with Live(answer, console=console, refresh_per_second=REFRESH_PER_SECOND, transient=True):
                reply = await ticket.reply
        for notice in ticket.notices:
            console.print(f"[dim]{notice}[/dim]")
        console.print(reply, markup=False, highlight=False)
    route = await db.get_route(key)
    if route:
        console.print(f"[dim]Session {route} saved. Continue with: switchboard chat -r {route}[/dim]")
