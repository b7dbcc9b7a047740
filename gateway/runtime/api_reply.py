"""How the local API answers: a submitted request's :class:`~gateway.control.Reply` written out whole,
streamed as it is written (server-sent events), or replayed (a retry with the same Idempotency-Key), and
every error as OpenAI-shaped JSON.  :class:`Replies` does it for every front door
(:class:`~gateway.runtime.api.LocalApi`); a :class:`~gateway.runtime.api_render.Format` gives the shape.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiohttp import web

import state
from gateway.control import Answering, Reply, Request, Requests
from gateway.errors import ContextTooLong, GatewayClosing, ModelRefused, ModelUnavailable
from gateway.failures import failure_line
from gateway.runtime.api_render import Answer, Format
from gateway.runtime.api_request import ApiError, ChatRequest
from gateway.runtime.api_sessions import Caller, Conversations
from gateway.runtime.sse import SseSink
from gateway.turn import ReplySink
from gateway.types import InboundMessage

log = logging.getLogger(__name__)

RETRY_AFTER_SHUTDOWN_SECONDS = 10  # about what a restart takes
RETRY_AFTER_RUNNING_SECONDS = 1
RETRY_AFTER_MODEL_SECONDS = 2
CUT_OFF = ("the gateway stopped before answering; your message is saved. Retry once it is back "
           "(with the same Idempotency-Key, to get its answer without sending it twice)")
SESSION_HEADER = "X-Switchboard-Session"
NOTICE_HEADER = "X-Switchboard-Notice"


def error(status: int, message: str, kind: str = "invalid_request_error", *,
          retry_after: int | None = None, code: str | None = None, param: str | None = None) -> web.Response:
    return error_response(ApiError(status, message, kind, code=code, param=param, retry_after=retry_after))


def error_response(problem: ApiError, headers: dict | None = None) -> web.Response:
    extra = dict(headers or {})
    if problem.retry_after is not None:
        extra["Retry-After"] = str(problem.retry_after)
    return web.json_response(problem.body(), status=problem.status, headers=extra or None)


def mismatch() -> web.Response:
    return error(422, "this Idempotency-Key was already used for another request (a different message); "
                      "use a new key for a new message", code="idempotency_key_reused")


def model_failure(exc: BaseException) -> ApiError:
    """The HTTP error for a turn the model did not answer (the user message stays stored); its message is
    the line a chat platform's user reads (what to fix, or that a retry may work)."""
    if isinstance(exc, ContextTooLong):
        return ApiError(400, failure_line(exc), code="context_length_exceeded")
    if isinstance(exc, ModelRefused):  # the gateway's own set-up is wrong (its key, its model name)
        return ApiError(502, failure_line(exc), "server_error", code="model_refused")
    if isinstance(exc, ModelUnavailable):
        kind = getattr(exc, "kind", "failing")
        if kind == "unreachable":
            return ApiError(502, failure_line(exc), "server_error", code="model_unreachable")
        if kind == "timeout":
            return ApiError(504, failure_line(exc), "server_error", code="model_timeout")
        return ApiError(503, failure_line(exc), "server_error", code="model_unavailable",
                        retry_after=RETRY_AFTER_MODEL_SECONDS)
    return ApiError(500, "Something went wrong while answering. Your message is saved; send it again to retry.",
                    "server_error", code="internal_error")


def notice_header(notice: str) -> str:
    """A notice as a header value: ASCII on one line (other characters escaped as ``\\u2192``)."""
    return " ".join(notice.splitlines()).encode("ascii", "backslashreplace").decode("ascii")


@dataclass(slots=True)
class Call:
    """One request on its way: what was asked, in which shape to answer, what to do once answered."""

    request: web.Request
    chat: ChatRequest
    fmt: Format
    stored: str  # the last user message as the store keeps it (a replay is checked against it)
    answered: Callable[[Answer], Awaitable[None]] | None = None
    model: str | None = None  # the named model the request chose (its ``model`` field), checked
    caller: Caller | None = None  # who sends it: the sessions it is answered in become its to name


class Replies:
    """The answers of one :class:`~gateway.runtime.api.LocalApi`: the conversations the answered sessions
    become their callers' in, the store a replay is read from (through ``requests``)."""

    def __init__(self, requests: Requests, conversations: Conversations) -> None:
        self._requests, self._conversations = requests, conversations

    async def respond(self, answering: Answering, submitted: Request, call: Call) -> web.StreamResponse:
        """The answer to a queued request: whole, or streamed as the model writes it."""
        if call.chat.stream and isinstance(submitted.sink, SseSink):
            return await self._stream(answering, submitted, submitted.sink, call)
        await asyncio.wait([answering.reply])
        return await self._settled(answering, submitted.sink, call)

    async def _settled(self, answering: Answering, sink: ReplySink | None, call: Call) -> web.StreamResponse:
        """The response for a request whose turn is over (sent whole, or as one chunk when asked to stream)."""
        try:
            reply = await answering.reply
        except GatewayClosing:
            return self._cut_off()
        except state.StateError as exc:
            log.error("API message not stored: %s", exc)
            return error(503, f"the message could not be stored, retry it: {exc}", "unavailable",
                         code="store_unavailable")
        if reply.replayed:
            return await self._replay(reply, call)
        if reply.held_for is not None:  # over limits.messages_per_minute: stored, no model call
            return error_response(ApiError(429, reply.text, "rate_limit_error", code="rate_limited",
                                            retry_after=max(1, math.ceil(reply.held_for))),
                                  self._headers(reply.session_id, list(reply.notices)))
        if reply.failure is not None:
            return error_response(model_failure(reply.failure), self._headers(reply.session_id, list(reply.notices)))
        answer = self._answer_of(reply, sink)
        await call.fmt.kept(answer)
        await self._owned(call, answer)
        if call.answered is not None:
            await call.answered(answer)
        return await self.whole(answer, call)

    async def _owned(self, call: Call, answer: Answer) -> None:
        """The session the answer is stored in becomes the caller's to name (``X-Switchboard-Session``)."""
        if call.caller is not None and answer.session_id:
            await self._conversations.remember_owner(call.caller, answer.session_id)

    @staticmethod
    def _answer_of(reply: Reply, sink: ReplySink | None) -> Answer:
        """The answer ``reply`` brings, as the formats write it out."""
        calls = list(reply.tool_calls)
        model = reply.model or (sink.model if isinstance(sink, SseSink) else None)
        return Answer(reply.text, reply.session_id, reply.session_key, reply.message_id, time.time(),
                      reply.prompt_tokens, reply.completion_tokens, list(reply.notices),
                      "tool_calls" if calls else "stop", calls, model)

    @staticmethod
    def _answer_so_far(answering: Answering, msg: InboundMessage, sink: SseSink) -> Answer:
        """What is known of an answer while it streams (no reply yet): its session, the model writing it."""
        return Answer("", answering.session_id, answering.session_key, msg.message_id, time.time(), 0, 0,
                      list(answering.notices), "stop", [], answering.model or sink.model)

    async def _stream(self, answering: Answering, submitted: Request, sink: SseSink,
                      call: Call) -> web.StreamResponse:
        """The answer as it is written; the turn goes on if the client leaves.

        The response starts with the first thing to show, so a failure before it is a plain HTTP error."""
        for notice in answering.notices:  # known now (a reset): a header and a comment
            sink.note(notice)
        seen_notices = len(answering.notices)
        done = answering.reply
        done.add_done_callback(lambda _: sink.wake())
        while not done.done() and not sink.pending:
            await sink.changed()
        if done.done() and (not sink.pending or done.exception() is not None or done.result().replayed):
            return await self._settled(answering, sink, call)
        events = await call.fmt.open(call.request, self._answer_so_far(answering, submitted.msg, sink),
                                     self._headers(answering.session_id, list(answering.notices)))
        await events.start()
        while True:
            finished = done.done()
            for kind, text in sink.take():
                if kind == "status":
                    await events.comment(text)
                elif kind == "notice":
                    await events.comment(f"notice: {text}")
                else:
                    await events.content(text)
            if finished:
                break
            if events.gone:
                sink.close()  # nobody reads: the turn answers on, and its answer is stored
            await sink.changed()
        if done.exception() is not None:  # shutdown cut the turn off: the SDK raises this as an APIError
            await events.error(CUT_OFF, "unavailable", "shutting_down")
            return await events.close()
        reply = done.result()
        if reply.failure is not None:  # the model failed after the stream began
            problem = model_failure(reply.failure)
            await events.error(problem.message, problem.kind, problem.code)
            return await events.close()
        sink.end(reply.text, list(reply.notices[seen_notices:]))
        for kind, text in sink.take():
            if kind == "notice":
                await events.comment(f"notice: {text}")
            elif kind == "content":
                await events.content(text)
        answer = self._answer_of(reply, sink)
        await call.fmt.kept(answer)
        await self._owned(call, answer)
        await events.finish(answer, call.chat.include_usage)
        if call.answered is not None:
            await call.answered(answer)
        return await events.close()

    async def whole(self, answer: Answer, call: Call) -> web.StreamResponse:
        """A whole answer: one JSON body, or (asked to stream) the same as one piece of content."""
        headers = self._headers(answer.session_id, answer.notices)
        if not call.chat.stream:
            return web.json_response(call.fmt.body(answer), headers=headers)
        events = await call.fmt.open(call.request, answer, headers)
        for notice in answer.notices:
            await events.comment(f"notice: {notice}")
        await events.start()
        if answer.content or not answer.tool_calls:
            await events.content(answer.content)
        await events.finish(answer, call.chat.include_usage)
        return await events.close()

    @staticmethod
    def _headers(session_id: str, notices: list[str]) -> dict:
        headers = {SESSION_HEADER: session_id} if session_id else {}
        if notices:  # one header; several notices are joined (a client splits them at " | ")
            headers[NOTICE_HEADER] = " | ".join(notice_header(n) for n in notices)
        return headers

    @staticmethod
    def _cut_off() -> web.Response:
        return error(503, CUT_OFF, "unavailable", retry_after=RETRY_AFTER_SHUTDOWN_SECONDS, code="shutting_down")

    async def _replay(self, replayed: Reply, call: Call) -> web.StreamResponse:
        """A request seen before (same Idempotency-Key in this conversation): the stored reply to it (its
        usage 0: no model call answers a replay), or the error saying why there is none."""
        db = self._requests.db
        session_id = await db.routes.get(replayed.session_key)
        messages = await db.messages.get(session_id) if session_id else []
        at = next((i for i, m in enumerate(messages)
                   if m.role == "user" and m.platform_message_id == replayed.message_id), None)
        if session_id is None or at is None:
            return error(409, "the message with this Idempotency-Key is stored elsewhere; retry later",
                         "conflict", code="conflict", retry_after=RETRY_AFTER_RUNNING_SECONDS)
        if messages[at].content != call.stored:
            return mismatch()
        reply = next((m for m in messages[at + 1:]
                      if m.role == "assistant" and m.content and not m.tool_calls), None)
        if reply is None:
            return error(409, "the message with this Idempotency-Key is stored but not answered yet; retry later "
                              "to get its reply", "conflict", code="conflict", retry_after=RETRY_AFTER_RUNNING_SECONDS)
        answer = Answer(reply.content or "", session_id, replayed.session_key, replayed.message_id,
                        reply.timestamp or time.time())
        return await self.whole(answer, call)
