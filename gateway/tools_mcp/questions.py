"""A tool server's questions to the user mid-call (MCP elicitation), asked in the chat of the person
whose call it is, as approvals are.

    questions = ToolQuestions(db, cfg.tools, clock=clock)
    McpTools(cfg.tools, registry, elicit=questions.ask)   # a server's question reaches ask()
    await questions.start(control)                        # where the questions are posted (gateway.control)
    /answer <id> <answer>                                 # a button press sends the same command

The call waits while its server's question is asked (the SDK holds it: a legacy ``elicitation/create``
request, or the retry of a 2026-07-28 ``InputRequiredResult``).  A form is asked one field at a time,
each as its own message naming the tool and the question's id: a choice or a yes/no with buttons
(where the platform has them), anything else answered by replying with the text (or ``/answer <id>
<text>``).  A field that is not required can be skipped (it then gets its default); "Decline" refuses
the whole form.  Only the person whose call it is can answer, in the chat it was asked in; an answer
that does not fit says why and the question goes on waiting.

Every question is stored (``db.questions``) when it is posted, and moves once from ``pending``: a
second press finds it answered.  Unanswered within ``tools.approval_timeout`` the server is told the
user declined.  In a cluster the answer may be given on another instance: each question is stored
with its form, so that instance checks the answer and stores it, and the waiting call reads its
question's row every second, going on within about a second of the answer being stored.

A restart (a kill -9 too) while a question waits: a 2026-07-28 server's question is of a retried
request (gateway.tools_mcp.rounds), stored with what sending it again needs, so it stays open.  The
turn answering the same message after the restart re-attaches to it (:meth:`ToolQuestions.resumed_answer`,
driven by gateway.tools_mcp.resume): the user answers the question already in the chat (an answer
given before the turn re-attached is kept), the form's other fields are asked, and the call is sent
again with the answers, its result going on to the model as if nothing had happened.  A legacy
server's question was a request on a connection that died with the gateway: at the next start it
is closed as interrupted and its chat told so, a late press says the same, and the model is told by
the crash journal that the call was cut off.

A link to open (URL mode) goes to the asker alone (gateway.tools_mcp.links).  Where nobody can answer
(a scheduled job, the local API, the terminal) the server is told the user declined.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import state
from gateway.approvals import buttoned
from gateway.config import ToolsConfig
from gateway.tools_mcp.elicit import Question, Value, form_content, form_questions
from gateway.tools_mcp.links import ToolLinks
from gateway.tools_mcp.rounds import Round
from gateway.tools_mcp.server import Asking
from gateway.types import Button, ChatRef, InboundMessage

if TYPE_CHECKING:  # pragma: no cover
    from mcp import types

    from gateway.commands import CommandContext
    from gateway.control import ChatControl

log = logging.getLogger(__name__)

NO_CHAT_PLATFORMS = frozenset({"cron", "api", "cli"})  # nobody reads a posted question there
START_SECONDS = 60.0  # a turn resumed after a restart waits at most this for the questions to be postable
ANSWER_POLL_SECONDS = 1.0  # a waiting question's row is read this often: an answer given on another instance


class _End:
    def __init__(self, name: str) -> None:
        self.name = name


DECLINE, SKIP, EXPIRED = _End("decline"), _End("skip"), _End("expired")


@dataclass
class _Waiting:
    question: Question
    row: dict
    answer: asyncio.Future


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{round(seconds / 60, 1):g} minutes"
    return f"{round(seconds, 1 if seconds < 10 else None):g} seconds"


def _shown(value: Value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(value) or "(none)"
    return str(value)


class ToolQuestions:
    """The MCP servers' ``elicit`` callback, the ``/answer`` command, plain replies to a question, and the
    settling of questions a restart cut off."""

    def __init__(self, db: state.AsyncSessionDB, cfg: ToolsConfig, *, clock: Callable[[], float] = time.time,
                 shared: bool = False) -> None:
        self.db = db
        self.clock = clock
        self.shared = shared  # a cluster's store: an answer may be given on another instance (read its row)
        self.router: ChatControl | None = None  # given at start(): where the questions are posted
        self._waiting: dict[str, _Waiting] = {}
        self._started = asyncio.Event()  # start() was called: questions can be posted
        self.links = ToolLinks()  # a server's links to open (URL mode)
        self.configure(cfg)

    def configure(self, cfg: ToolsConfig) -> None:
        self.timeout = cfg.approval_timeout

    # -- asked by a server (gateway.tools_mcp.server.Elicit) ---------------------------------
    async def ask(self, asking: Asking, params: types.ElicitRequestParams) -> types.ElicitResult:
        from mcp import types  # a question comes from a connected server: the SDK is loaded by then

        ctx = asking.context
        extra = getattr(ctx, "extra", None) or {}
        chat: ChatRef | None = extra.get("chat")
        router = self.router
        if (ctx is None or chat is None or router is None or ctx.platform in NO_CHAT_PLATFORMS
                or not router.has_output(chat.platform)):
            log.info("%s asked the user something where nobody can answer; declined", asking.tool)
            return types.ElicitResult(action="decline")
        if isinstance(params, types.ElicitRequestURLParams):  # a link to open: to the asker alone
            return await self.links.ask(asking, params, router, chat)
        if not isinstance(params, types.ElicitRequestFormParams):
            return types.ElicitResult(action="decline")
        try:
            questions = form_questions(params.requested_schema)
        except ValueError as exc:
            log.warning("%s asked with a form a chat cannot ask (%s); declined", asking.tool, exc)
            await router.deliver(chat, f"{asking.tool} asked for something that cannot be asked here ({exc}); "
                                       "it was told no.", None)
            return types.ElicitResult(action="decline")
        deadline = self.clock() + self.timeout
        answers: dict[str, Value] = {}
        intro = f"**{asking.tool}** asks: {params.message.strip()[:1500]}"
        # the form is stored for every question (an answer given on another instance is checked against
        # it there); a 2026-07-28 question also with what sending its call again needs
        form = {"message": params.message, "schema": params.requested_schema}
        retry = json.dumps(form if asking.round is None else
                           {"round": asking.round.as_dict(), "key": asking.key, **form}, ensure_ascii=False)
        for n, question in enumerate(questions, 1):
            got = await self._ask_one(asking, chat, question, intro if n == 1 else None, n, len(questions),
                                      deadline, retry)
            if got is DECLINE or got is EXPIRED:
                return types.ElicitResult(action="decline")
            if not isinstance(got, _End):
                answers[question.name] = got
        return types.ElicitResult(action="accept", content=form_content(questions, answers))

    async def _ask_one(self, asking: Asking, chat: ChatRef, question: Question, intro: str | None, n: int,
                       total: int, deadline: float, retry: str | None) -> Value | _End:
        ctx = asking.context
        qid = secrets.token_hex(4)
        row = {"id": qid, "session_id": ctx.session_id, "session_key": ctx.session_key, "platform": chat.platform,
               "chat_id": chat.chat_id, "thread_id": chat.thread_id, "user_id": ctx.user_id, "tool": asking.tool,
               "field": question.name, "kind": question.kind, "choices": json.dumps(question.choices),
               "asked_at": self.clock(), "expires_at": deadline, "call_id": (ctx.extra or {}).get("tool_call_id"),
               "round_id": asking.round.round_id if asking.round is not None else None, "retry": retry}
        await self.db.questions.add(row)
        waiting = _Waiting(question, row, asyncio.get_running_loop().create_future())
        self._waiting[qid] = waiting
        router = self.router
        assert router is not None  # ask() declines before a question when there is none
        buttons = self._buttons(qid, question) if buttoned(chat.platform) else ()
        try:
            await router.deliver(chat, self._text(qid, question, intro, n, total, deadline, bool(buttons)),
                                 None, buttons=buttons)
        except BaseException:
            self._waiting.pop(qid, None)
            raise
        return await self._wait(waiting, asking.tool, chat)

    async def _wait(self, waiting: _Waiting, tool: str, chat: ChatRef) -> Value | _End:
        """The answer to a posted question, or EXPIRED once its time is up (the chat is told)."""
        qid, deadline = waiting.row["id"], waiting.row["expires_at"]
        router = self.router
        assert router is not None
        try:
            try:
                return await self._answered(waiting, max(deadline - self.clock(), 0.01))
            except asyncio.TimeoutError:
                if await self.db.questions.close(qid, "expired", now=self.clock()):
                    log.info("question %s of %s ran out unanswered; declined", qid, tool)
                    await router.deliver(chat, f"Question {qid} ({tool}) was not answered within "
                                                    f"{_duration(self.timeout)}; the server was told no.", None)
                    return EXPIRED
                if waiting.answer.done():  # answered in the same moment: that answer stands
                    return waiting.answer.result()
                # decided where this call does not wait (another instance): as the store says
                return _ended(await self.db.questions.get(qid) or {**waiting.row, "status": "expired"})
        finally:
            self._waiting.pop(qid, None)

    async def _answered(self, waiting: _Waiting, seconds: float) -> Value | _End:
        """The answer given within ``seconds``: here (the future), or, on a cluster's store, on another
        instance (its row, read every ANSWER_POLL_SECONDS); asyncio.TimeoutError when none came."""
        if not self.shared:  # one instance: every answer comes through this process
            return await asyncio.wait_for(asyncio.shield(waiting.answer), max(seconds, 0))
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while True:
            left = end - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(asyncio.shield(waiting.answer), min(left, ANSWER_POLL_SECONDS))
            row = await self.db.questions.get(waiting.row["id"])
            if waiting.answer.done():  # answered here while the row was read
                return waiting.answer.result()
            if row is not None and row["status"] != "pending":
                return _ended(row)

    def _text(self, qid: str, q: Question, intro: str | None, n: int, total: int, deadline: float,
              buttoned: bool) -> str:
        lines = [intro] if intro else []
        lines.append(f"Question {n} of {total} (question {qid}): {q.prompt()}")
        how = "Press a button" if buttoned and q.buttoned else "Reply with your answer"
        skip = "" if q.required else f", /answer {qid} skip to leave it{' at its default' if q.default not in (None, '') else ''}"
        lines.append(f"{how} (or /answer {qid} <answer>{skip}, /answer {qid} decline to refuse the whole form). "
                     f"Unanswered, it is declined in {_duration(max(deadline - self.clock(), 0))}.")
        return "\n".join(lines)

    def _buttons(self, qid: str, q: Question) -> tuple[Button, ...]:
        out: list[Button] = []
        if q.kind == "boolean":
            out += [Button("Yes", f"/answer {qid} yes", "primary"), Button("No", f"/answer {qid} no")]
        elif q.kind == "choice" and q.buttoned:  # by number: a platform's button data is short (Telegram: 64 bytes)
            out += [Button(label[:60], f"/answer {qid} #{i}") for i, (_, label) in enumerate(q.choices, 1)]
        if not q.required:
            out.append(Button("Skip" if q.default is None or q.default == "" else f"Default ({_shown(q.default)[:30]})",
                              f"/answer {qid} skip"))
        out.append(Button("Decline", f"/answer {qid} decline", "danger"))
        return tuple(out)

    async def link_done(self, server: str, elicitation_id: str) -> None:
        """A server's ``notifications/elicitation/complete``: the asker is told the step at the link is done."""
        await self.links.done(server, elicitation_id, self.router)

    # -- answered: /answer, a button, or a plain reply ----------------------------------------
    async def answer_command(self, ctx: CommandContext) -> str:
        msg = ctx.ticket.msg
        qid, _, text = ctx.command.args.strip().partition(" ")
        if not qid:
            mine = self._mine(msg)
            if not mine:
                return "No question here waits for your answer."
            return "Say which question: " + "; ".join(f"/answer {w.row['id']} … ({w.row['tool']}: {w.question.title})"
                                                      for w in mine[:10])
        return await self._answer(msg, qid.lower(), text)

    async def take_reply(self, msg: InboundMessage) -> bool:
        """A plain message from someone a question in this chat waits for is the answer to it (the
        newest, when several do): answered here, never a turn.  False: not an answer, route it as usual."""
        if msg.is_command or not msg.text.strip():
            return False
        mine = self._mine(msg)
        if not mine:
            return False
        said = await self._answer(msg, mine[-1].row["id"], msg.text)
        if self.router is not None:
            await self.router.deliver(msg.chat, said, msg.message_id)
        return True

    def _mine(self, msg: InboundMessage) -> list[_Waiting]:
        return [w for w in self._waiting.values()
                if (w.row["platform"], w.row["chat_id"], w.row["user_id"]) == (msg.platform, msg.chat_id, msg.user_id)]

    async def _answer(self, msg: InboundMessage, qid: str, text: str) -> str:
        row = await self.db.questions.get(qid)
        if row is None or (row["platform"], row["chat_id"]) != (msg.platform, msg.chat_id):
            return f"There is no question {qid} in this chat."  # another chat's: not even its existence is told
        if row["status"] != "pending":
            return _closed(row)
        if msg.user_id is None or msg.user_id != row["user_id"]:
            return (f"Only the person whose call it is can answer question {qid} ({row['tool']}); nothing changed.")
        waiting = self._waiting.get(qid)
        by = f"{msg.platform}:{msg.user_id}"
        kept = waiting is None
        if waiting is None:
            question = _stored_question(row)
            if question is None:  # a question stored without its form, whose call is not here: it ended
                await self.db.questions.close(qid, "interrupted", now=self.clock())
                return _closed({**row, "status": "interrupted"})
            if row["round_id"] is None and self.clock() >= row["expires_at"]:  # no call waits for it any more
                await self.db.questions.close(qid, "expired", now=self.clock())
                return _closed(await self.db.questions.get(qid) or {**row, "status": "expired"})
            # its call waits on another instance (which reads the stored answer), or, of a 2026-07-28
            # server, is sent again after a restart by the turn that resumes it
            waiting = _Waiting(question, row, asyncio.get_running_loop().create_future())
        word = text.strip()
        if word.lower() == "decline":
            if not await self.db.questions.close(qid, "declined", by=by, now=self.clock()):
                return _closed(await self.db.questions.get(qid) or row)
            self._settle(qid, waiting, DECLINE)
            return f"Declined: {row['tool']} was told no (question {qid})."
        question = waiting.question
        if word.lower() == "skip":
            if question.required:
                return f"Question {qid} must be answered (or declined); it still waits."
            value: Value | _End = SKIP
        else:
            try:
                value = question.parse(_by_number(question, word))
            except ValueError as exc:
                return f"That does not fit question {qid}: {exc}. It still waits for your answer."
        stored = None if isinstance(value, _End) else json.dumps(value)
        if not await self.db.questions.close(qid, "answered", answer=stored, by=by, now=self.clock()):
            return _closed(await self.db.questions.get(qid) or row)
        self._settle(qid, waiting, value)
        log.info("question %s of %s answered by %s", qid, row["tool"], by)
        shown = "left at its default" if value is SKIP else _shown(value)  # type: ignore[arg-type]
        later = "" if not kept else ("; the call goes on" if row["round_id"] is None else
                                     "; the call goes on (after a restart: once the gateway has resumed it)")
        return f"Noted for {row['tool']}: {question.title} = {shown} (question {qid}){later}."

    def _settle(self, qid: str, waiting: _Waiting, value: Value | _End) -> None:
        """Hand the decided answer to the call waiting for it: the one this answer found, and the one a
        turn resumed after a restart may have re-attached while the answer was being stored."""
        for target in (waiting, self._waiting.get(qid)):
            if target is not None and not target.answer.done():
                target.answer.set_result(value)

    # -- a call sent again after a restart (gateway.tools_mcp.resume) -------------------------
    async def resumed_answer(self, asking: Asking, rows: list[dict]) -> types.ElicitResult:
        """The answer to a server's form asked before a restart (``rows``: its questions, in the order
        asked): the questions answered are taken as they were, the one still open waits again for its
        answer, and the fields not asked yet are asked now, by the same deadline."""
        from mcp import types

        with contextlib.suppress(asyncio.TimeoutError):  # a turn resumed at start may come before start()
            await asyncio.wait_for(self._started.wait(), START_SECONDS)
        first = rows[0]
        stored = json.loads(first["retry"])
        questions = form_questions(stored["schema"])
        chat = ChatRef(first["platform"], first["chat_id"], first["thread_id"])
        by_field = {r["field"]: r for r in rows}
        answers: dict[str, Value] = {}
        for n, question in enumerate(questions, 1):
            row = by_field.get(question.name)
            if row is not None:
                got = await self._reattached(row, question, asking.tool, chat)
            elif self.router is None:
                got = DECLINE
            else:
                got = await self._ask_one(asking, chat, question, None, n, len(questions), first["expires_at"],
                                          first["retry"])
            if got is DECLINE or got is EXPIRED:
                return types.ElicitResult(action="decline")
            if not isinstance(got, _End):
                answers[question.name] = got
        return types.ElicitResult(action="accept", content=form_content(questions, answers))

    async def _reattached(self, row: dict, question: Question, tool: str, chat: ChatRef) -> Value | _End:
        if row["status"] == "pending" and self.router is not None:
            waiting = _Waiting(question, row, asyncio.get_running_loop().create_future())
            self._waiting[row["id"]] = waiting  # first, then read again: an answer in between is not missed
            fresh = await self.db.questions.get(row["id"])
            if fresh is not None and fresh["status"] == "pending":
                log.info("question %s of %s waits again for its answer after a restart", row["id"], tool)
                return await self._wait(waiting, tool, chat)
            self._waiting.pop(row["id"], None)
            row = fresh or row
        return _ended(row)

    async def cut_off(self, rows: list[dict]) -> None:
        """The call of ``rows`` cannot be sent again: its open questions are closed as interrupted, and said so."""
        await self._interrupted([r for r in rows if r["status"] == "pending"])

    async def _interrupted(self, rows: list[dict]) -> None:
        for row in rows:
            if row["id"] in self._waiting or not await self.db.questions.close(row["id"], "interrupted",
                                                                                now=self.clock()):
                continue
            log.warning("question %s of %s was cut off by a restart; its call ended", row["id"], row["tool"])
            if self.router is not None:
                await self.router.deliver(ChatRef(row["platform"], row["chat_id"], row["thread_id"]),
                                          f"Question {row['id']} ({row['tool']}) was cut off: the gateway restarted "
                                          "while it waited, and the call it belonged to ended.", None)

    async def resent(self, round_: Round) -> None:
        """A round's answers are about to be sent (live): a turn resumed after a crash never sends them again."""
        await self.db.questions.resend(round_.round_id, now=self.clock())

    # -- after a restart -----------------------------------------------------------------------
    async def start(self, control: ChatControl, *, settle: bool = True) -> None:
        """Post questions through ``control`` from now on; close the questions a stop left pending (their
        calls ended with it) and tell their chats."""
        self.router = control
        self._started.set()
        if not settle:
            return
        # a question whose call can be sent again stays open for the turn resumed after the restart
        await self._interrupted([r for r in await self.db.questions.pending() if not await self._resumable(r)])

    async def _resumable(self, row: dict) -> bool:
        """Whether the turn resumed after a restart takes ``row`` up: a call that can be sent again, cut
        off in a turn whose journal says it was running (past its deadline too: it then declines)."""
        if row["round_id"] is None or row["retry"] is None or row["call_id"] is None or row["session_id"] is None:
            return False
        return row["call_id"] in await self.db.tool_journal.running(row["session_id"])


def _by_number(question: Question, word: str) -> str:
    """``#n`` (what a choice's button sends) as that choice's value."""
    if question.kind == "choice" and word.startswith("#") and word[1:].isdigit():
        index = int(word[1:]) - 1
        if 0 <= index < len(question.choices):
            return question.choices[index][0]
    return word


def _ended(row: dict) -> Value | _End:
    """What a closed question's row says its answer was."""
    if row["status"] == "answered":
        return SKIP if row["answer"] is None else json.loads(row["answer"])
    return DECLINE if row["status"] == "declined" else EXPIRED


def _stored_question(row: dict) -> Question | None:
    """The question of a row as asked (from its stored form), else None (a legacy server's question
    stored by a version that kept no form)."""
    if row.get("retry") is None:
        return None
    try:
        questions = form_questions(json.loads(row["retry"])["schema"])
    except (ValueError, KeyError, TypeError):
        return None
    return next((q for q in questions if q.name == row["field"]), None)


def _closed(row: dict) -> str:
    how = {"answered": "answered", "declined": "declined", "expired": "declined (no answer in time)",
           "interrupted": "cut off by a restart (the call it belonged to ended)"}.get(row["status"], row["status"])
    return f"Question {row['id']} ({row['tool']}) is already closed: {how}."
