"""``switchboard chat``: the agent in a terminal, through the same router as every platform (its
:class:`~gateway.control.Requests` entry).

The session key is ``agent:<agent>:cli:dm:<login>``.  A plain ``chat`` starts a
new session; ``-c`` continues the session the terminal was in when it left
(else the most recently active of its sessions; or the newest of a title's
lineage), ``-r`` resumes by id, prefix or title.  A prefix or a title names terminal sessions only; another surface's
session (an API user's, a Telegram chat's) is continued only when given by its
whole id.  On resume a recap panel shows where the conversation stood.

The answer streams into the terminal as the model writes it (a rich Live): a
spinner until the first text (with a running tool's status line beside it),
then the newest lines of the text; once the answer is done it is printed
whole, in place of the live view.  Ctrl-C stops the answer being written
(kept as far as it got, marked ``(stopped)``); at the prompt, or a second
time, it leaves, as Ctrl-D does.  Piped, standard output gets the answers only, and the exit status
is 1 when a turn got no answer from the model (the line saying why went to standard output as the
answer does).  A chat that sent only commands (``/help``, ``/status``) leaves no empty session behind.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import mimetypes
import os
import re
import stat
import sys
from pathlib import Path

from rich.console import Console, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.spinner import Spinner
from rich.text import Text

import state
from gateway.cli.terminal import TerminalInput, catch_interrupts
from gateway.config import Config
from gateway.control import STOPPED_MARK, Answering, Reply, Request, Requests
from gateway.errors import SwitchboardError
from gateway.media import media_limits
from gateway.runtime.daemon import local_gateway
from gateway.types import Attachment, ChatType, InboundMessage, MediaLimits, article, attachment_kind

# Markdown that reads badly raw (bold, inline code, a fence, a list item): drawn by rich in a terminal
_MARKDOWN = re.compile(r"\*\*[^*\n]+\*\*|`[^`\n]+`|^```|^\s*[-*] ", re.M)
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

    @property
    def text(self) -> str:
        """What the model has written of the answer so far."""
        return self._text

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


def recap(messages: list[state.StoredMessage]) -> Text:
    """The recap panel's body: the last exchanges, user in gold, assistant in green, tool calls collapsed."""
    shown = [m for m in messages if m.role in ("user", "assistant")]
    user_turns = [i for i, m in enumerate(shown) if m.role == "user"]
    start = user_turns[-RECAP_EXCHANGES] if len(user_turns) > RECAP_EXCHANGES else 0
    body = Text(style="dim")
    if start:
        body.append(f"... {start} earlier messages ...\n\n", style="dim italic")
    for m in shown[start:]:
        if m.role == "user":
            body.append("● You: ", style="bold gold1")
            body.append(_cut(m.content or "", USER_CHARS) + "\n")
            continue
        calls = m.tool_calls or []
        if isinstance(calls, str):
            calls = json.loads(calls)
        if calls:
            names = ", ".join(c.get("function", {}).get("name", "?") for c in calls)
            body.append(f"  [{len(calls)} tool call{'s' if len(calls) != 1 else ''}: {names}]\n", style="dim")
        if m.content:
            body.append("◆ Agent: ", style="bold green")
            body.append(_cut(m.content, ASSISTANT_CHARS, ASSISTANT_LINES) + "\n")
    return body


async def _terminal_session(db: state.AsyncSessionDB, ref: str) -> str:
    """The session ``ref`` names (an id, a prefix or a title, the newest of its lineage).

    A whole id may name any surface's session (the operator asked for that one);
    a prefix or a title names only terminal sessions (source ``cli``), so an API
    user's or a platform chat's conversation is never continued by accident.
    """
    if await db.sessions.get(ref) is not None:
        return ref
    target = await db.sessions.resolve_id(ref)
    session = await db.sessions.get(target)
    source = session.source if session is not None else None
    if source != "cli":
        raise SwitchboardError(
            f"{ref!r} names a {source} session ({target}), not one of this terminal's; "
            f"to continue it here anyway, give its whole id: switchboard chat -r {target}"
        )
    return target


async def _pick_session(requests: Requests, key: str, continue_: str | None, resume: str | None) -> str | None:
    """Point ``key`` at the session to continue; None when this chat starts a new one."""
    db = requests.db
    if resume:
        target = await _terminal_session(db, resume)
    elif continue_:
        target = await _terminal_session(db, continue_)
    elif continue_ is not None:
        # where the terminal was when it left (a /resume'd session, not an empty one /new made before it),
        # else the most recently active of its sessions
        routed = await db.routes.session(key)
        rows = [routed] if routed else await db.sessions.list_rich(source="cli", session_key=key, limit=1)
        if not rows:
            return None
        target = rows[0]["id"]
    else:
        await _start_fresh(requests, key)
        return None
    target = await db.sessions.compression_tip(target) or target
    session = await db.sessions.get(target)
    if session is None:  # deleted meanwhile: a fresh one instead
        await _start_fresh(requests, key)
        return None
    if session.ended_at is not None:
        await db.sessions.reopen(target)
    await db.routes.set(key, target)
    return target


async def _start_fresh(requests: Requests, key: str) -> None:
    """A plain ``switchboard chat``: the terminal's open session ends (saved, as with /new); the first
    message starts a new one."""
    db = requests.db
    routed = await db.routes.session(key)
    if routed is None:
        return
    if routed.get("ended_at") is None:
        await db.sessions.end(routed["id"], "new_session")
        requests.session_ended(routed["id"], key)
    await db.routes.delete(key)


async def run_chat(config: Config, *, continue_: str | None = None, resume: str | None = None,
                   console: Console | None = None, read_line=None, interactive: bool | None = None) -> int:
    """The chat until Ctrl-D, end of input, or Ctrl-C at the prompt.

    ``interactive`` (default: standard input is a terminal) shows the prompt, the live answer and
    the notes; piped, standard output gets the answers only (notes go to standard error).  Tests
    pass ``read_line`` (a function returning the next line, raising EOFError at the end) in place
    of standard input.  Returns the exit status: 1 when a turn failed (the model gave no answer)."""
    interactive = sys.stdin.isatty() if interactive is None else interactive
    console = console or Console(soft_wrap=not interactive)
    notes = console if interactive else Console(stderr=True, soft_wrap=True)
    async with local_gateway(config) as gateway:
        assert gateway.router is not None
        chat = _Chat(gateway.router.requests, console, notes, interactive, limits=media_limits(config))
        await chat.run(continue_, resume, read_line)
        return 1 if chat.failed and not interactive else 0


_NO_LIMITS = MediaLimits()


class _Chat:
    """One terminal conversation: what was typed goes to the router (``requests``); Ctrl-C stops the answer being
    written (marked ``(stopped)``, and stored so, as on the platforms), or, at the prompt or a second
    time, leaves with the hint to continue."""

    def __init__(self, requests: Requests, console: Console, notes: Console, interactive: bool, *,
                 limits: MediaLimits = _NO_LIMITS) -> None:
        self.requests, self.db = requests, requests.db
        self.limits = limits  # the most /attach sends of a file, per kind (media.max_bytes)
        self.attached: list[Attachment] = []  # files /attach gave, sent with the next message
        self.console, self.notes, self.interactive = console, notes, interactive
        self.login = getpass.getuser()
        self.key = requests.key_for(InboundMessage(platform="cli", chat_type=ChatType.DM, chat_id=self.login,
                                                 user_id=self.login, text=""))
        self.input: TerminalInput | None = None
        self.answering: Answering | None = None  # the message whose answer is being written
        self.interrupted_once = False  # Ctrl-C was pressed during this answer
        self.stopped = False  # ... and cut the answer short (it had not finished)
        self.failed = False  # a turn got no answer from the model (piped: exit 1)

    def interrupted(self) -> None:
        """Ctrl-C: the first one while an answer is written stops it; at the prompt, or again, leave."""
        if self.answering is not None and not self.interrupted_once:
            self.interrupted_once = True
            self.stopped = self.requests.stop(self.key)  # False: it finished meanwhile, and is shown whole
            return
        if self.input is not None:
            self.input.leave()

    async def run(self, continue_: str | None, resume: str | None, read_line) -> None:
        resumed = await _pick_session(self.requests, self.key, continue_, resume)
        if continue_ == "" and not resume and resumed is None:
            self.notes.print("[dim]No earlier terminal session to continue: this is a new one.[/dim]")
        if resumed:
            session = await self.db.sessions.get(resumed)
            title = (session.title if session is not None else None) or resumed
            self.notes.print(Panel(recap(await self.db.messages.get(resumed)), title=f"Previous conversation: {title}",
                                   border_style="dim"))
        if self.interactive:
            self.notes.print("[dim]Type a message; /help for commands; /attach PATH sends a file with your next "
                             "message; Ctrl-C stops an answer; Ctrl-D or Ctrl-C at the prompt leaves.[/dim]")
        undo = None
        if read_line is None and not _pollable_stdin():
            read_line = _read_stdin_line
        if read_line is None:
            self.input = TerminalInput(prompt="› " if self.interactive else "")
            undo = catch_interrupts(self.interrupted)
        try:
            await self._converse(read_line)
        finally:
            if undo is not None:
                undo()
        route = await self.db.routes.get(self.key)
        if route and route != resumed and await self._forget_if_empty(route):
            route = None
        if route:
            if self.interactive and self.input is not None:
                self.notes.print("")  # after the ^C or the prompt the terminal shows
            self.notes.print(f"[dim]Session {route} saved. Continue with: switchboard chat -r {route}[/dim]",
                             soft_wrap=True)

    async def _forget_if_empty(self, session_id: str) -> bool:
        """A session this chat started that holds no message (only commands were sent): deleted, with
        its route, so it does not top ``sessions list``.  True when it was."""
        session = await self.db.sessions.get(session_id)
        if session is None or session.message_count or await self.db.messages.get(session_id):
            return False
        await self.db.routes.delete(self.key)
        await self.db.sessions.delete(session_id)
        return True

    async def _next_line(self, read_line) -> str | None:
        if self.input is not None:
            return await self.input.read_line()
        try:
            return await asyncio.to_thread(read_line)
        except EOFError:
            return None

    async def _converse(self, read_line) -> None:
        while True:
            line = await self._next_line(read_line)
            if line is None:
                return
            if not line.strip():
                continue
            if line.strip().split(maxsplit=1)[0] == "/attach":
                await self._attach(line.strip()[len("/attach"):].strip())
                continue
            msg = InboundMessage(platform="cli", chat_type=ChatType.DM, chat_id=self.login, user_id=self.login,
                                 user_name=self.login, text=line, attachments=tuple(self.attached))
            self.attached = []
            answer = LiveAnswer(self.console)
            answering = await self.requests.begin(self.key, Request(msg, sink=answer))
            if answering is None:
                continue
            if not await self._answer(answering, answer):
                return

    async def _attach(self, path: str) -> None:
        """``/attach PATH``: the file goes with the next message (read now, within media.max_bytes)."""
        try:
            attachment = await asyncio.to_thread(read_attachment, path, self.limits)
        except AttachError as exc:
            self.notes.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
            return
        self.attached.append(attachment)
        self.notes.print(f"[dim]Attached {escape(attachment.name)} ({attachment.kind}, {attachment.size:,} bytes); "
                         "it goes with your next message.[/dim]", soft_wrap=True)

    async def _answer(self, answering: Answering, answer: LiveAnswer) -> bool:
        """Show the answer to the message ``answering`` answers; False when Ctrl-C twice means leave."""
        if answering.reply.done():  # a command, answered at once
            reply = answering.reply.result()
        else:
            self.answering, self.interrupted_once, self.stopped = answering, False, False
            try:
                if self.interactive:
                    with Live(answer, console=self.console, refresh_per_second=REFRESH_PER_SECOND, transient=True):
                        got = await self._reply_or_leave(answering)
                else:
                    got = await self._reply_or_leave(answering)
            finally:
                self.answering = None
            if got is None:
                return False
            reply = got
            if self.stopped:
                await self._show_stopped(reply.session_id, answer)
                return True
        for notice in reply.notices:
            self.notes.print(f"[dim]{notice}[/dim]")
        if reply.failure is not None:
            self.failed = True
        if self.interactive and _MARKDOWN.search(reply.text):  # an approval request, a code block: drawn, not raw
            self.console.print(Markdown(reply.text, code_theme="ansi_dark"))
        else:
            self.console.print(reply.text, markup=False, highlight=False)
        return True

    async def _reply_or_leave(self, answering: Answering) -> Reply | None:
        """The reply, or None when the chat is left (Ctrl-C again) before it came."""
        if self.input is None:
            return await answering.reply
        leaving = asyncio.ensure_future(self.input.leaving.wait())
        try:
            either: set[asyncio.Future] = {answering.reply, leaving}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
        return answering.reply.result() if answering.reply.done() else None

    async def _show_stopped(self, session_id: str, answer: LiveAnswer) -> None:
        """An answer Ctrl-C cut short: as far as it got, marked (stopped), and stored so (as /stop does on
        the platforms); before any text, a line saying the message is kept."""
        if not answer.text.strip():
            self.notes.print("[dim](stopped before the answer began; your message is saved)[/dim]")
            return
        self.console.print(answer.text, markup=False, highlight=False)
        self.console.print("[dim](stopped)[/dim]")
        try:
            await self.db.messages.record_turn(session_id, [{"role": "assistant", "content": stopped_text(answer.text),
                                                           "finish_reason": "stopped"}])
        except state.StateError as exc:
            self.notes.print(f"[dim]the stopped answer could not be stored: {exc}[/dim]")


class AttachError(SwitchboardError):
    """A file ``/attach`` cannot send (the message says which and why)."""


def read_attachment(path: str, limits: MediaLimits) -> Attachment:
    """The file at ``path`` as an attachment of the kind its name says, if it is within its kind's limit."""
    if not path:
        raise AttachError("/attach needs a file: /attach PATH (a picture, a document, an audio file)")
    file = Path(path.strip("'\"")).expanduser()
    if not file.is_file():
        raise AttachError(f"cannot attach {path}: no such file" if not file.exists() else
                          f"cannot attach {path}: not a file")
    mime = mimetypes.guess_type(file.name)[0]
    kind = attachment_kind(mime, file.name)
    limit = limits.for_kind(kind)
    size = file.stat().st_size
    if size > limit:
        raise AttachError(f"cannot attach {file.name}: {size:,} bytes is more than the {limit:,} {article(kind)} may have "
                          "(media.max_bytes)" if limit else f"cannot attach {file.name}: a {mime or 'file'} "
                          "is not sent to the model (pictures, audio and documents are)")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise AttachError(f"cannot attach {path}: {exc.strerror or exc}") from None
    return Attachment(kind, file.name, mime_type=mime, size=len(data), data=data)


def _pollable_stdin() -> bool:
    """Whether the event loop can wait on standard input: a terminal or a pipe, not a regular file
    (``< questions.txt``, which epoll refuses) nor a stream without a descriptor; those are read in a thread,
    where a read never waits long."""
    try:
        return not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False


def _read_stdin_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.removesuffix("\n")


def stopped_text(text: str) -> str:
    """How a stopped answer is stored, the same on every surface."""
    return f"{text}\n\n{STOPPED_MARK}"
