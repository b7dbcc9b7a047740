"""A fake OpenAI-compatible model server on 127.0.0.1 (port 0) for tests and benchmarks.

It speaks ``POST /v1/chat/completions`` (plain, or streamed as Server-Sent Events with
``"stream": true``, paced by ``stream_chunk_chars`` and ``stream_interval``, or in the pieces a
``Reply(chunks=...)`` names) and ``GET /v1/models``,
records every request, and answers by default with a reply that proves what
the model was shown::

    echo: <last user message> | turns: <number of user messages> | first: <first user message>

It also serves the audio API: ``POST /v1/audio/transcriptions`` (multipart; answers
``transcript``, after ``transcribe_delay``, or fails with ``transcribe_fail``) and ``POST
/v1/audio/speech`` (answers ``speech_audio`` or fails with ``speech_fail``), recording each request
in ``transcriptions`` and ``speeches``.

Tests steer it with :meth:`FakeModel.script`, a queue of behaviours consumed
one request at a time (``Reply``, ``Fail``, ``ToolCall``, ``ToolCalls``, ``ReasoningToolCall``, ``Hang``,
``Held``, ``CutOff``, ``NoChoice``), with
``delay`` (seconds before every answer), and with ``responder`` (a function of
the request's messages whose string, when it returns one, replaces the echo), and with
``context_limit`` (a prompt estimated above that many tokens is refused with
OpenAI's 400 ``context_length_exceeded``), and ``llama_cpp_window`` (the same limit as llama.cpp's
server keeps it: an over-window streamed request gets 200 and an empty event stream, no data, no
``finish_reason``, no ``[DONE]``; unstreamed, a 400 in the wording llama.cpp, vLLM and OpenAI share,
"This model's maximum context length is N tokens"), ``EmptyStream`` (that empty stream, scripted), and with ``tool_loop`` (a ``ToolCall`` made by every turn:
the answer to each request that offers tools and ends with the user's message; ``--tool-loop`` run
as a script).  Run as a script it serves until
killed, printing ``PORT <n>`` first (used by the benchmarks)::

    python -m tests.fakes.model_server --delay 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from aiohttp import web

from tests.waiting import eventually


@dataclass
class Reply:
    text: str
    prompt_tokens: int | None = None  # None: estimate from the request
    chunks: tuple[str, ...] | None = None  # streamed: exactly these pieces (joined, they are ``text``)
    finish_reason: str = "stop"  # "length": cut off by the window (or the answer's cap)


@dataclass
class Fail:
    status: int = 500
    retry_after: float | None = None
    message: str = "upstream failure"
    code: str | None = None  # OpenAI's error code, e.g. "invalid_api_key", "model_not_found"
    type: str = "server_error"


def refusal(status: int) -> Fail:
    """How OpenAI's API answers a bad key (401), a model the key may not use (403), an unknown model (404)."""
    return {
        401: Fail(401, message="Incorrect API key provided. You can find your API key at the dashboard.",
                  code="invalid_api_key", type="invalid_request_error"),
        403: Fail(403, message="You are not allowed to use this model.", code="model_not_allowed",
                  type="invalid_request_error"),
        404: Fail(404, message="The model `fake-model` does not exist or you do not have access to it.",
                  code="model_not_found", type="invalid_request_error"),
    }[status]


@dataclass
class ToolCall:
    name: str
    arguments: dict
    call_id: str = "call_1"
    content: str | None = None  # text the model writes before the call


@dataclass
class ToolCalls:
    """Several calls in one answer (parallel tool calls), after ``content`` if any."""

    calls: list[ToolCall]
    content: str | None = None


@dataclass
class ReasoningToolCall:
    """A tool call that comes with the model's reasoning; the next request must send that
    assistant message back with the same reasoning fields, or it fails (HTTP 400), as providers do
    for a tool loop whose reasoning went missing."""

    name: str
    arguments: dict
    reasoning: dict = field(default_factory=lambda: {
        "reasoning": "I should look this up first.",
        "reasoning_details": [{"type": "reasoning.encrypted", "data": "gAAAA-opaque", "id": "rs_1", "index": 0}],
    })
    call_id: str = "call_1"


@dataclass
class Hang:
    seconds: float = 3600.0


@dataclass
class Held:
    """The usual answer, once the test sets ``release``: a model that takes as long as the test needs
    (to send more messages while a turn runs, without a sleep standing in for it)."""

    release: asyncio.Event


@dataclass
class NoChoice:
    """A 200 answer without any choice in it (a broken proxy or a server in trouble)."""


@dataclass
class EmptyStream:
    """A streamed request answered 200 with an event stream that ends at once: no data, no ``finish_reason``,
    no ``[DONE]`` (what llama.cpp's server sends for a prompt over its window); unstreamed, an empty answer."""


@dataclass
class CutOff:
    """A streamed answer that breaks off: the first ``after`` characters of ``text``, then the connection drops."""

    text: str
    after: int


@dataclass
class Recorded:
    body: dict
    headers: dict
    at: float = field(default_factory=time.monotonic)
    first_chunk: float | None = None  # time.monotonic() when a streamed answer's first text went out
    answered: float | None = None  # time.monotonic() when the answer was ready (the system's clock: comparable
    # across processes, so a benchmark can take the model's own time out of a latency it measured)

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages", [])

    @property
    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "user":
                return _text_of(m)
        return ""


def _has_reasoning(messages: list[dict], call_id: str, reasoning: dict) -> bool:
    """Whether the assistant message that made ``call_id`` came back with exactly ``reasoning``."""
    for m in messages:
        if m.get("role") == "assistant" and any(c.get("id") == call_id for c in m.get("tool_calls") or []):
            return all(m.get(k) == v for k, v in reasoning.items())
    return False


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _unreadable_image(messages: list[dict]) -> str | None:
    """Why a strict vision endpoint refuses one of the pictures of ``messages`` (None: it reads them all)."""
    import base64
    import io

    from PIL import Image

    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            url = (part.get("image_url") or {}).get("url", "")
            if not url.startswith("data:"):
                continue
            try:
                data = base64.b64decode(url.partition(",")[2])
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
                    if image.mode == "CMYK":
                        return "the image is CMYK"
            except Exception as exc:  # noqa: BLE001 - any failure to decode is the refusal
                return f"the image could not be decoded ({type(exc).__name__})"
    return None


class FakeModel:
    def __init__(self, *, delay: float = 0.0, model_name: str = "fake-model", port: int = 0):
        self.delay = delay
        self._bind_port = port  # 0: any free port
        self.model_name = model_name
        # GET /v1/models lists these (default: model_name alone), each with vLLM's max_model_len when set
        self.served: list[str] | None = None
        self.max_model_len: int | None = None
        self.requests: list[Recorded] = []
        self._script: list = []
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        # optional: messages -> reply text, used instead of the default echo when it returns a string
        self.responder: Callable[[list[dict]], str | None] | None = None
        # optional: prompts estimated above this many tokens get a 400 context_length_exceeded
        self.context_limit: int | None = None
        # optional: the same, as llama.cpp's server does it (an empty 200 stream when streamed)
        self.llama_cpp_window: int | None = None
        self.refused: list[Recorded] = []  # the requests refused (or emptied) for their length
        self._expect_reasoning: tuple[str, dict] | None = None  # set by ReasoningToolCall for the next request
        # optional: a request that offers tools and ends with the user's message gets this call (a tool in
        # every turn, however many turns run at once; the request after the tool's result gets the answer)
        self.tool_loop: ToolCall | None = None
        # a streamed answer ("stream": true) comes this many characters to a chunk, this many seconds apart
        self.stream_chunk_chars = 8
        self.stream_interval = 0.0
        # usage as reported: this many of each prompt's tokens read from the cache
        # (``prompt_tokens_details.cached_tokens``); ``report_usage`` False: no ``usage`` at all
        self.cached_tokens = 0
        self.report_usage = True
        # /v1/audio/transcriptions: answers ``transcript`` after ``transcribe_delay`` seconds, or fails with
        # ``transcribe_fail`` (a Fail) while it is set; every request is recorded (fields and file bytes)
        self.transcript = "hello from a voice note"
        self.transcripts: list[str] = []  # when set, each request takes the first of these instead
        self.transcribe_delay = 0.0
        self.transcribe_fail: Fail | None = None
        self.transcriptions: list[dict] = []
        # /v1/audio/speech: answers ``speech_audio`` (or fails with ``speech_fail``); requests recorded
        self.speech_audio = b"OggS\x00fake-opus-audio"
        self.speech_fail: Fail | None = None
        self.speeches: list[dict] = []
        # a vision endpoint's own check of the pictures it is sent: "strict" decodes each (as OpenAI's API
        # and llama.cpp's server do) and answers 400 invalid_image_format for one that does not decode
        # whole, or that is CMYK (which stb_image, llama.cpp's decoder, does not read); None: anything goes
        self.images: str | None = None

    # -- steering ---------------------------------------------------------
    def script(self, *behaviours) -> None:
        self._script.extend(behaviours)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[Recorded]:
        await eventually(lambda: len(self.requests) >= n, timeout, lambda: f"{n} model requests, got {len(self.requests)}")
        return self.requests

    # -- server -----------------------------------------------------------
    async def __aenter__(self) -> "FakeModel":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_post("/v1/audio/speech", self._speech)
        app.router.add_get("/_timings", self._timings)
        app.router.add_get("/_transcriptions", self._transcription_timings)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._bind_port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        if self._runner:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        entries = [{"id": name, "object": "model", **({"max_model_len": self.max_model_len} if self.max_model_len else {})}
                   for name in (self.served or [self.model_name])]
        return web.json_response({"object": "list", "data": entries})

    @staticmethod
    def _failure(fail: Fail) -> web.Response:
        return web.json_response({"error": {"message": fail.message, "type": fail.type, "code": fail.code}},
                                 status=fail.status)

    async def _transcriptions(self, request: web.Request) -> web.Response:
        """OpenAI's transcription API: a multipart form with ``file`` and ``model``; answers ``{"text": ...}``."""
        form = await request.post()
        fields: dict = {}
        for key, value in form.items():
            if isinstance(value, str):
                fields[key] = value
            else:
                fields[key] = {"filename": value.filename, "content_type": value.content_type,
                               "data": value.file.read()}
        fields["at"] = time.monotonic()
        self.transcriptions.append(fields)
        if self.transcribe_delay:
            await asyncio.sleep(self.transcribe_delay)
        fields["answered"] = time.monotonic()
        if not isinstance(fields.get("file"), dict) or not fields.get("model"):
            return self._failure(Fail(400, message="file and model are required", type="invalid_request_error"))
        if self.transcribe_fail is not None:
            return self._failure(self.transcribe_fail)
        return web.json_response({"text": self.transcripts.pop(0) if self.transcripts else self.transcript})

    async def _speech(self, request: web.Request) -> web.Response:
        """OpenAI's speech API: JSON ``model``, ``input``, ``voice``, ``response_format``; answers the audio."""
        body = await request.json()
        self.speeches.append(body)
        if self.speech_fail is not None:
            return self._failure(self.speech_fail)
        if not body.get("input") or not body.get("model") or not body.get("voice"):
            return self._failure(Fail(400, message="model, input and voice are required", type="invalid_request_error"))
        return web.Response(body=self.speech_audio, content_type="audio/ogg")

    async def _transcription_timings(self, request: web.Request) -> web.Response:
        """Each transcription request's arrival and answer (time.monotonic(), comparable across processes)."""
        return web.json_response([{"at": t["at"], "answered": t.get("answered")} for t in self.transcriptions])

    async def _timings(self, request: web.Request) -> web.Response:
        """Each request's last user message with when it arrived and when its answer was ready."""
        return web.json_response([{"last_user": r.last_user_text, "at": r.at, "answered": r.answered,
                                   "first_chunk": r.first_chunk} for r in self.requests])

    async def _stream(self, request: web.Request, record: Recorded, message: dict, finish: str,
                      usage: dict | None, cut_after: int | None = None,
                      chunks: tuple[str, ...] | None = None) -> web.StreamResponse:
        """The answer as Server-Sent Events in the Chat Completions chunk format, ending with [DONE]."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        body = record.body
        base = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": body.get("model", self.model_name)}

        async def send(delta: dict | None, finish_reason: str | None = None, **extra) -> None:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            await response.write(f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode())

        extra = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls")}
        await send({"role": "assistant", "content": "", **extra})
        text = message.get("content") or ""
        size = max(1, self.stream_chunk_chars)
        if chunks is None:
            chunks = tuple(text[start:start + size] for start in range(0, len(text), size))
        start = 0
        for piece in chunks:
            if cut_after is not None and start >= cut_after:
                assert request.transport is not None
                request.transport.abort()  # the connection drops mid-answer
                return response
            if self.stream_interval and start:
                await asyncio.sleep(self.stream_interval)
            await send({"content": piece})
            if start == 0:
                record.first_chunk = time.monotonic()
            start += len(piece)
        for index, call in enumerate(message.get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            await send({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}]})
            for start in range(0, len(arguments), size):
                await send({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + size]}}]})
        await send({}, finish)
        if (body.get("stream_options") or {}).get("include_usage") and usage is not None:
            await send(None, usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await request.json()
        record = Recorded(body=body, headers=dict(request.headers), at=arrived)
        self.requests.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            behaviour = self._script.pop(0) if self._script else None
            if behaviour is None and self.tool_loop is not None and body.get("tools") \
                    and (body.get("messages") or [{}])[-1].get("role") == "user":
                behaviour = self.tool_loop
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.images == "strict" and (refused := _unreadable_image(body.get("messages") or [])):
                return web.json_response({"error": {
                    "message": f"Invalid image: {refused}. Supported formats are PNG, JPEG, GIF and WebP.",
                    "type": "invalid_request_error", "param": None, "code": "invalid_image_format"}}, status=400)
            if isinstance(behaviour, Hang):
                await asyncio.sleep(behaviour.seconds)
            if isinstance(behaviour, Held):
                await behaviour.release.wait()
            if isinstance(behaviour, Fail):
                headers = {}
                if behaviour.retry_after is not None:
                    headers["Retry-After"] = str(behaviour.retry_after)
                return web.json_response(
                    {"error": {"message": behaviour.message, "type": behaviour.type, "param": None,
                               "code": behaviour.code}},
                    status=behaviour.status,
                    headers=headers,
                )
            if isinstance(behaviour, NoChoice):
                return web.json_response({"id": "chatcmpl-broken", "object": "chat.completion", "choices": []})
            messages = body.get("messages", [])
            expected, self._expect_reasoning = self._expect_reasoning, None
            if expected is not None and not _has_reasoning(messages, *expected):
                return web.json_response(
                    {"error": {"message": "reasoning of the previous tool call is missing", "type": "invalid_request_error"}},
                    status=400,
                )
            prompt_tokens = sum(len(_text_of(m)) for m in messages) // 4 + 4 * len(messages)
            if isinstance(behaviour, EmptyStream) or (self.llama_cpp_window is not None
                                                      and prompt_tokens > self.llama_cpp_window):
                if self.llama_cpp_window is not None and prompt_tokens > self.llama_cpp_window:
                    self.refused.append(record)
                if body.get("stream"):
                    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await response.prepare(request)
                    await response.write_eof()
                    return response
                if isinstance(behaviour, EmptyStream):
                    return web.json_response({"id": "chatcmpl-empty", "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]})
                window = self.llama_cpp_window
                return web.json_response({"error": {
                    "code": 400, "message": (f"This model's maximum context length is {window} tokens. However, "
                                             f"your request has {prompt_tokens} tokens. Please reduce the length "
                                             "of the messages."),
                    "type": "invalid_request_error", "param": "messages", "code_name": "context_length_exceeded",
                    "n_prompt_tokens": prompt_tokens, "n_ctx": window}}, status=400)
            if self.context_limit is not None and prompt_tokens > self.context_limit:
                return web.json_response({"error": {
                    "message": (f"This model's maximum context length is {self.context_limit} tokens. However, your "
                                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."),
                    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
                    status=400)
            if isinstance(behaviour, (ToolCall, ToolCalls, ReasoningToolCall)):
                calls = behaviour.calls if isinstance(behaviour, ToolCalls) else [behaviour]
                message = {
                    "role": "assistant",
                    "content": getattr(behaviour, "content", None),
                    "tool_calls": [
                        {
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                        }
                        for call in calls
                    ],
                }
                if isinstance(behaviour, ReasoningToolCall):
                    message.update(behaviour.reasoning)
                    self._expect_reasoning = (behaviour.call_id, behaviour.reasoning)
                finish = "tool_calls"
            else:
                if isinstance(behaviour, CutOff):
                    text = behaviour.text
                elif isinstance(behaviour, Reply):
                    text = behaviour.text
                    if behaviour.prompt_tokens is not None:
                        prompt_tokens = behaviour.prompt_tokens
                else:
                    text = self.responder(messages) if self.responder is not None else None
                    if text is None:
                        text = self.default_reply(messages)
                message = {"role": "assistant", "content": text}
                finish = behaviour.finish_reason if isinstance(behaviour, Reply) else "stop"
            completion_tokens = len(message.get("content") or "") // 4 + 1
            usage: dict | None = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                  "total_tokens": prompt_tokens + completion_tokens}
            if self.cached_tokens and usage is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": min(self.cached_tokens, prompt_tokens)}
            if not self.report_usage:
                usage = None
            if body.get("stream"):
                return await self._stream(request, record, message, finish, usage,
                                          cut_after=behaviour.after if isinstance(behaviour, CutOff) else None,
                                          chunks=tuple(c for c in behaviour.chunks if c) if isinstance(behaviour, Reply)
                                          and behaviour.chunks is not None else None)
            return web.json_response(
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", self.model_name),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    **({"usage": usage} if usage is not None else {}),
                }
            )
        finally:
            self.in_flight -= 1
            record.answered = time.monotonic()

    @staticmethod
    def default_reply(messages: list[dict]) -> str:
        users = [_text_of(m) for m in messages if m.get("role") == "user"]
        last = users[-1] if users else ""
        first = users[0] if users else ""
        return f"echo: {last} | turns: {len(users)} | first: {first}"


async def start_in_process(delay: float = 0.0) -> tuple[asyncio.subprocess.Process, int]:
    """This fake in a process of its own (as the benchmarks run it): the process and its port."""
    root = Path(__file__).resolve().parents[2]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.model_server", "--delay", str(delay),
        cwd=root, stdout=asyncio.subprocess.PIPE,
    )
    line = (await proc.stdout.readline()).decode()
    return proc, int(line.split()[1])


async def _serve(delay: float, chunk_chars: int = 8, interval: float = 0.0, reply_chars: int = 0,
                 transcribe_delay: float = 0.0, tool_loop: str | None = None) -> None:
    async with FakeModel(delay=delay) as fake:
        fake.transcribe_delay = transcribe_delay
        if tool_loop:
            call = json.loads(tool_loop)
            fake.tool_loop = ToolCall(call["name"], call.get("arguments") or {})
        fake.stream_chunk_chars, fake.stream_interval = chunk_chars, interval
        if reply_chars:
            words = ("The answer goes on, word after word, as a model writes it. " * (reply_chars // 40 + 1))
            fake.responder = lambda messages: words[:reply_chars]
        print(f"PORT {fake.port}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--stream-chunk-chars", type=int, default=8, help="characters per streamed chunk")
    parser.add_argument("--stream-interval", type=float, default=0.0, help="seconds between streamed chunks")
    parser.add_argument("--reply-chars", type=int, default=0, help="answer with this many characters (0: the echo)")
    parser.add_argument("--transcribe-delay", type=float, default=0.0, help="seconds each transcription takes")
    parser.add_argument("--tool-loop", default=None, metavar="JSON",
                        help='every turn calls this tool first: {"name": "session_search", "arguments": {...}}')
    args = parser.parse_args()
    try:
        import uvloop  # the fake should cost the benchmarks as little as a real server would

        uvloop.run(_serve(args.delay, args.stream_chunk_chars, args.stream_interval, args.reply_chars,
                          args.transcribe_delay, args.tool_loop))
    except KeyboardInterrupt:
        pass
