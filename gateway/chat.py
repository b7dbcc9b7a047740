"""``switchboard chat``: the agent in a terminal, through the same router as every platform.

The session key is ``agent:<agent>:cli:dm:<login>``.  ``-c`` continues the
most recent terminal session (or the newest of a title's lineage), ``-r``
resumes by id, prefix or title; on resume a recap panel shows where the
conversation stood (seed 004, "Conversation recap on resume").
"""

from __future__ import annotations

import asyncio
import getpass
import json

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from gateway.config import Config
from gateway.daemon import Gateway
from gateway.types import ChatType, InboundMessage

RECAP_EXCHANGES = 10
USER_CHARS = 300
ASSISTANT_CHARS = 200
ASSISTANT_LINES = 3


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


async def _pick_session(gw: Gateway, key: str, continue_: str | None, resume: str | None) -> str | None:
    db = gw.db
    target = None
    if resume:
        target = await db.resolve_session_id(resume)
    elif continue_ is not None:
        if continue_:
            target = await db.resolve_session_id(continue_)
        else:
            rows = await db.list_sessions_rich(source="cli", limit=1)
            target = rows[0]["id"] if rows else None
    if target is None:
        return None
    target = await db.get_compression_tip(target) or target
    session = await db.get_session(target)
    if session.get("ended_at") is not None:
        await db.reopen_session(target)
    await db.set_route(key, target)
    return target


async def run_chat(config: Config, *, continue_: str | None = None, resume: str | None = None,
                   console: Console | None = None, read_line=None) -> None:
    console = console or Console()
    read_line = read_line or (lambda: input("› "))
    gw = Gateway(config, adapters={}, serve_api=False)
    await gw.start()
    try:
        login = getpass.getuser()
        probe = InboundMessage(platform="cli", chat_type=ChatType.DM, chat_id=login, user_id=login, text="")
        key = gw.router.key_for(probe)
        resumed = await _pick_session(gw, key, continue_, resume)
        if resumed:
            session = await gw.db.get_session(resumed)
            title = session.get("title") or resumed
            console.print(Panel(recap(await gw.db.get_messages(resumed)), title=f"Previous conversation: {title}",
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
            ticket = await gw.router.handle(msg)
            if ticket is None:
                continue
            reply = await ticket.reply
            for notice in ticket.notices:
                console.print(f"[dim]{notice}[/dim]")
            console.print(reply, markup=False, highlight=False)
        route = await gw.db.get_route(key)
        if route:
            console.print(f"[dim]Session {route} saved. Continue with: switchboard chat -r {route}[/dim]")
    finally:
        await gw.stop(grace_seconds=5)
