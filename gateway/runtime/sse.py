"""A streamed answer of the local API: Server-Sent Events in the Chat Completions chunk format.

:class:`SseSink` is where the turn writes the answer (a :class:`~gateway.turn.ReplySink`): it
queues pieces of content and status lines, in order, for the request's handler, which sends
them through :class:`ChunkEvents` as ``chat.completion.chunk`` events.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

log = logging.getLogger(__name__)


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def call_deltas(calls: list[dict]) -> dict:
    """Tool calls as one streamed ``delta`` (each whole, with its index)."""
    return {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                           for i, c in enumerate(calls)]}


class SseSink:
    """Where the turn writes one streamed request's answer (a :class:`~gateway.turn.ReplySink`): pieces of
    content and status lines, queued in order for the handler to send as events.

    Sent chunks cannot be taken back, so text that a tool call follows (a model's "let me look that
    up" before it calls the tool) stays in the stream: the text after it starts a new paragraph.
    The stored answer, and a replay of it, hold the answer alone."""

    def __init__(self) -> None:
        self.answer = ""  # the text of the model call now streaming
        self._pieces: list[tuple[str, str]] = []  # ("content" | "status", text), not yet sent
        self._shown = False  # some content was queued
        self._paragraph = False  # the next content starts a new paragraph
        self._changed = asyncio.Event()
        self._closed = False
        self.model: str | None = None  # the model whose call is writing now (the answer's, once it writes)

    def answering(self, model: str) -> None:
        """The turn's model call starts on ``model`` (a fallback, when the first failed)."""
        self.model = model

    def feed(self, delta: str) -> None:
        if delta and not self._closed:
            self.answer += delta
            self._content(delta)

    def show_status(self, line: str) -> None:
        if not self._closed:
            self._pieces.append(("status", line))
            self.wake()

    def discard_text(self) -> None:
        self.answer = ""  # already sent: the next model call's text is the answer
        self._paragraph = True

    def note(self, line: str) -> None:
        """A line for the user besides the answer (a notice): an SSE comment, never content."""
        if not self._closed:
            self._pieces.append(("notice", line))
            self.wake()

    @property
    def pending(self) -> bool:
        """Whether something waits to be sent."""
        return bool(self._pieces)

    def end(self, reply: str, notices: list[str]) -> None:
        """The turn's reply (and notices it added): queue what the stream has not shown of it yet."""
        if reply.startswith(self.answer):
            rest = reply[len(self.answer):]
        else:  # not the streamed text (a failure, a stop): it follows what was shown
            rest, self._paragraph = reply, True
        if rest:
            self._content(rest)
        for notice in notices:
            self.note(notice)

    def _content(self, text: str) -> None:
        if self._paragraph and self._shown:
            text = "\n\n" + text
        self._paragraph = False
        self._shown = True
        self._pieces.append(("content", text))
        self.wake()

    def take(self) -> list[tuple[str, str]]:
        pieces, self._pieces = self._pieces, []
        self._changed.clear()
        return pieces

    def wake(self) -> None:
        self._changed.set()

    async def changed(self) -> None:
        await self._changed.wait()

    def close(self) -> None:
        """The client left: keep nothing more (the turn goes on and stores its answer)."""
        self._closed = True
        self._pieces.clear()


class ChunkEvents:
    """One Server-Sent Events response in the Chat Completions chunk format; a client that left is
    noted (``gone``), never raised."""

    def __init__(self, response: web.StreamResponse, base: dict):
        self._response = response
        self._base = base
        self.gone = False

    @classmethod
    async def open(cls, request: web.Request, base: dict, headers: dict | None = None) -> ChunkEvents:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no", **(headers or {})})
        events = cls(response, base)
        try:
            await response.prepare(request)
        except ConnectionError:
            events.gone = True
        return events

    async def start(self) -> None:
        await self.send({"role": "assistant", "content": ""})

    async def content(self, text: str) -> None:
        await self.send({"content": text})

    async def finish(self, answer, include_usage: bool) -> None:
        """The chunk with the finish reason, then (asked for) one with the usage and no choice.  From here
        on the chunks name the session the answer is stored in (a compression may have moved it on)."""
        if "session_id" in self._base:
            self._base["session_id"] = answer.session_id
        if answer.model:  # the model that answered (known for sure only now: a later call may fall back)
            self._base["model"] = answer.model
        if answer.tool_calls:  # calls of the client's tools: one delta with each call whole
            await self.send(call_deltas(answer.tool_calls))
        await self.send({}, answer.finish_reason)
        if include_usage:
            await self.usage(answer.prompt_tokens, answer.completion_tokens)

    async def send(self, delta: dict, finish_reason: str | None = None) -> None:
        await self._data({**self._base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    async def usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        await self._data({**self._base, "choices": [], "usage": usage_of(prompt_tokens, completion_tokens)})

    async def error(self, message: str, kind: str, code: str | None = None) -> None:
        """An ``error`` event: the openai SDK raises it as an ``APIError``."""
        await self._data({"error": {"message": message, "type": kind, "param": None, "code": code}})

    async def comment(self, line: str) -> None:
        """A line the client's parser skips (a tool's status: it is not content)."""
        await self._write(f": {' '.join(line.splitlines())}\n\n")

    async def close(self) -> web.StreamResponse:
        await self._write("data: [DONE]\n\n")
        if not self.gone:
            try:
                await self._response.write_eof()
            except ConnectionError:
                self.gone = True
        return self._response

    async def _data(self, payload: dict) -> None:
        await self._write(f"data: {json.dumps(payload)}\n\n")

    async def _write(self, text: str) -> None:
        if self.gone:
            return
        try:
            await self._response.write(text.encode())
        except ConnectionError:
            self.gone = True
            log.info("an API client left mid-stream; its answer is still stored")
