"""The model endpoint: any OpenAI-compatible server through the ``openai`` SDK.

:class:`ModelClient` bounds concurrent calls (``model.max_concurrent_calls``),
retries 429, 5xx, connection errors and timeouts with exponential backoff and
jitter (honouring ``Retry-After``) within ``model.retry_total_seconds``, and
raises :class:`gateway.errors.ModelUnavailable` after the last failure.  A
refusal (400 for context length, 401, 403, 404) is not retried and raises
its own subclass (:func:`as_model_error`), so the user is told what to fix.
The SDK's own retries are off so there is one policy, ours.

With ``on_text``, :meth:`ModelClient.complete` streams (``stream=True`` with
``stream_options.include_usage``): each piece of answer text goes to
``on_text`` as it arrives, tool calls are put together from their deltas,
and the result is the same :class:`Completion` a plain call returns, usage
from the last chunk.  A stream that fails before any text is retried like a
plain call; one that breaks off after text was shown raises
:class:`~gateway.errors.AnswerCutOff` with the text so far.

Every call says what it is for (a :class:`gateway.usage.CallContext`); with a
:class:`gateway.usage.UsageRecorder` each one, ok, retried or failed, becomes a
row of the usage ledger: its tokens as the endpoint reported them (cached reads
from ``prompt_tokens_details.cached_tokens``), or estimated when it reported
none, its latency and its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import openai
from openai import AsyncStream, RequestOptions
from openai.types.chat import ChatCompletion

import compression
from gateway.errors import (
    AnswerCutOff,
    ContextTooLong,
    ModelAuthRejected,
    ModelForbidden,
    ModelNotFound,
    ModelRefused,
    ModelUnavailable,
)
from gateway.retry import Backoff, retry_async
from gateway.usage import OTHER, CallContext, ModelCall, Outcome, UsageRecorder

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSettings:
    base_url: str
    api_key: str
    name: str
    timeout_seconds: float = 120.0
    max_concurrent_calls: int = 8
    max_retries: int = 5
    retry_total_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class Completion:
    message: dict  # the assistant message, OpenAI chat format
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    cache_write_tokens: int = 0  # of prompt_tokens, written to it
    reported: bool = True  # False: the endpoint reported no usage (the counts are 0)


def _cache_counts(usage: Any) -> tuple[int, int]:
    """(cached reads, cache writes) from a ``usage`` object or dict: OpenAI's
    ``prompt_tokens_details.cached_tokens``; writes as OpenRouter (``cache_write_tokens``) or
    Anthropic (``cache_creation_input_tokens``) report them."""
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    details = get(usage, "prompt_tokens_details") or {}
    cached = get(details, "cached_tokens") or get(usage, "cache_read_input_tokens") or 0
    written = get(details, "cache_write_tokens") or get(usage, "cache_creation_input_tokens") or 0
    return int(cached), int(written)


KEEPALIVE_CONNECTIONS = 8  # the httpx fallback polls every idle connection on every request: keep few


def _pool_limits(max_calls: int):
    from openai._constants import DEFAULT_CONNECTION_LIMITS  # the SDK's own Limits type (httpx)

    return type(DEFAULT_CONNECTION_LIMITS)(max_connections=max_calls,
                                           max_keepalive_connections=min(KEEPALIVE_CONNECTIONS, max_calls),
                                           keepalive_expiry=DEFAULT_CONNECTION_LIMITS.keepalive_expiry)


def http_client(max_calls: int):
    """The SDK's aiohttp transport, else its default (httpx).

    With 100 calls in flight the httpx pool walks every connection on every request (and polls
    the idle ones), and its request path runs through anyio and h11 in Python: the aiohttp
    transport cut the gateway's CPU per turn by about a quarter (2.5-2.9 ms against 3.5-4.0,
    100 sessions sending at once, ``bench/gateway.py``).
    """
    limits = _pool_limits(max_calls)
    try:
        return openai.DefaultAioHttpClient(limits=limits)
    except (AttributeError, RuntimeError):  # an SDK without its aiohttp extra
        return openai.DefaultAsyncHttpxClient(limits=limits)


def _retry_after(exc: openai.APIStatusError) -> float:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def classify(exc: BaseException) -> float | None:
    """Seconds to wait at least before retrying, or None when retrying cannot help."""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return 0.0
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429 or exc.status_code >= 500:
            return _retry_after(exc)
    return None


_CONTEXT_WORDS = ("context length", "context window", "context size", "maximum context", "too many tokens",
                  "prompt is too long")
_REFUSALS: dict[int, type[ModelRefused]] = {401: ModelAuthRejected, 403: ModelForbidden, 404: ModelNotFound}


def _is_context_length(exc: openai.APIStatusError) -> bool:
    """OpenAI says ``code: context_length_exceeded``; vLLM, llama.cpp and others only say it in words."""
    if getattr(exc, "code", None) == "context_length_exceeded":
        return True
    said = f"{getattr(exc, 'type', '') or ''} {exc.message or ''}".lower().replace("_", " ")
    return any(words in said for words in _CONTEXT_WORDS) or "exceed context" in said


def as_model_error(exc: BaseException) -> ModelUnavailable:
    """The gateway's error for the client's last failure: a typed refusal for a 4xx that
    says what to fix, else :class:`ModelUnavailable` (a later message may work)."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (400, 413) and _is_context_length(exc):
            return ContextTooLong(status, f"HTTP {status}: context length exceeded")
        if status in _REFUSALS:
            return _REFUSALS[status](status, _describe(exc))
    return ModelUnavailable(_describe(exc), _failure_kind(exc))


def _failure_kind(exc: BaseException) -> str:
    """``unreachable``, ``timeout`` or ``failing``: how a call that kept failing failed (see ModelUnavailable)."""
    if _connect_error(exc) is not None:  # the aiohttp transport reports a refused connection as a timeout
        return "unreachable"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "unreachable"
    return "failing"


# Request fields a caller may set on a call (the local API passes its client's on); anything else is ours.
PASSED_PARAMS = frozenset({"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
                           "response_format", "tool_choice"})
PROBE_EVERY_SECONDS = 2.0  # at most one reachability probe this often while the endpoint is down


@dataclass(slots=True)
class EndpointHealth:
    """What the last calls (or a probe) said of the endpoint: ``ok``, ``unknown`` (no call yet) or
    ``unreachable`` (the last call failed to connect, timed out or kept failing), since when, and why."""

    state: str = "unknown"
    since: float | None = None
    last_error: str | None = None

    def as_dict(self) -> dict:
        return {"state": self.state, "since": self.since, "last_error": self.last_error}


class ModelClient:
    def __init__(self, settings: ModelSettings, *, metrics=None, usage: UsageRecorder | None = None,
                 backoff: Backoff = Backoff(base=0.5, cap=20.0)):
        self.settings = settings
        self._metrics = metrics
        self._usage = usage  # the ledger: one row per call; None: not recorded
        self._backoff = backoff
        self._client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key or "not-needed",
            timeout=settings.timeout_seconds,
            max_retries=0,
            http_client=http_client(settings.max_concurrent_calls),
        )
        self._slots = asyncio.Semaphore(settings.max_concurrent_calls)
        self.health = EndpointHealth()
        self._probed_at = 0.0

    def _note(self, ok: bool, error: str | None = None) -> None:
        if ok and self.health.state != "ok":
            self.health = EndpointHealth("ok", time.time())
        elif not ok:
            since = self.health.since if self.health.state == "unreachable" else time.time()
            self.health = EndpointHealth("unreachable", since, error)

    async def probe(self) -> EndpointHealth:
        """While the last call said the endpoint is down, see (at most every few seconds, with a
        short timeout) whether it answers ``GET /models`` again; any answer below 500 counts."""
        now = time.monotonic()
        if self.health.state != "unreachable" or now - self._probed_at < PROBE_EVERY_SECONDS:
            return self.health
        self._probed_at = now
        try:
            await self._client.get("/models", cast_to=object, options={"timeout": 3.0})
        except openai.APIStatusError as exc:
            if exc.status_code < 500:
                self._note(True)
        except (openai.OpenAIError, OSError, asyncio.TimeoutError):
            pass
        else:
            self._note(True)
        return self.health

    async def complete(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        model: str | None = None,
        timeout: float | None = None,
        on_text: Callable[[str], None] | None = None,
        purpose: CallContext = OTHER,
        params: dict[str, Any] | None = None,
    ) -> Completion:
        """One model call (retried as the module docstring says); ``purpose`` is what the usage
        ledger records it as; ``params`` are request fields of :data:`PASSED_PARAMS` (temperature,
        response_format, ...) sent as they are."""
        started, clock = time.monotonic(), self._usage.clock() if self._usage is not None else 0.0
        attempts = [1]
        try:
            completion = await self._complete(messages, tools, model, timeout, on_text, attempts, params)
        except ModelRefused as exc:
            self._note(True)  # it answered: reachable, it just refused this request
            self._record(purpose, model, messages, started, clock, attempts[0], None, exc)
            raise
        except ModelUnavailable as exc:
            if not isinstance(exc, AnswerCutOff):
                self._note(False, str(exc))
            self._record(purpose, model, messages, started, clock, attempts[0], None, exc)
            raise
        except BaseException as exc:
            self._record(purpose, model, messages, started, clock, attempts[0], None, exc)
            raise
        self._note(True)
        self._record(purpose, model, messages, started, clock, attempts[0], completion, None)
        return completion

    def _record(self, purpose: CallContext, model: str | None, messages: list[dict], started: float, clock: float,
                attempts: int, completion: Completion | None, failure: BaseException | None) -> None:
        if self._usage is None:
            return
        try:
            cached = written = 0
            if completion is not None and completion.reported:
                prompt_tokens, completion_tokens, estimated = completion.prompt_tokens, completion.completion_tokens, False
                cached, written = completion.cached_tokens, completion.cache_write_tokens
            else:  # nothing reported (or a failure): what the prompt and the answer so far come to
                partial = failure.partial if isinstance(failure, AnswerCutOff) else ""
                answer = completion.message if completion is not None else {"role": "assistant", "content": partial}
                prompt_tokens, estimated = compression.estimate_tokens(messages), True
                completion_tokens = compression.estimate_tokens([answer]) \
                    if answer.get("content") or answer.get("tool_calls") else 0
            outcome: Outcome = "ok" if attempts == 1 else "retried"
            error = None
            if failure is not None:
                outcome = "failed"
                error = "cancelled" if isinstance(failure, asyncio.CancelledError) else \
                    f"{type(failure).__name__}: {failure}"[:200]
            self._usage.record(ModelCall(
                context=purpose, model=model or self.settings.name, at=clock,
                latency_ms=(time.monotonic() - started) * 1000, outcome=outcome, attempts=attempts, error=error,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached,
                cache_write_tokens=written, estimated=estimated))
        except Exception:  # the ledger never fails a model call
            log.exception("usage ledger: the call could not be recorded")

    async def _complete(self, messages: list[dict], tools: list[dict] | None, model: str | None,
                        timeout: float | None, on_text: Callable[[str], None] | None,
                        attempts: list[int], params: dict[str, Any] | None = None) -> Completion:
        body: dict[str, Any] = {k: v for k, v in (params or {}).items() if k in PASSED_PARAMS}
        body.update({"model": model or self.settings.name, "messages": messages})
        if tools:
            body["tools"] = tools
        else:
            body.pop("tool_choice", None)  # no tool offered on this call: OpenAI refuses a tool_choice then
        options: RequestOptions = {} if timeout is None else {"timeout": timeout}
        if on_text is not None:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}

        async def call():
            async with self._slots:
                if on_text is not None:
                    return await self._streamed(body, options, on_text)
                # The SDK's typed ``chat.completions.create`` re-walks every message through its
                # TypedDict transformer (about 14 ms for a 20-message prompt, measured with
                # cProfile); our messages are already plain JSON, so post them as they are and
                # let the SDK do the rest (auth, HTTP, errors).  The answer is read as plain JSON
                # too: building its ChatCompletion model was about 0.5 ms of a turn's CPU.
                return await self._client.post("/chat/completions", cast_to=object, body=body, options=options)

        def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
            attempts[0] = attempt + 1
            log.warning("model call failed (%s), retry %d in %.1fs", _describe(exc), attempt, wait)
            if self._metrics:
                self._metrics.model_retries.inc()

        try:
            response = await retry_async(
                call,
                classify=classify,
                backoff=self._backoff,
                max_attempts=self.settings.max_retries + 1,
                total_seconds=self.settings.retry_total_seconds,
                on_retry=on_retry,
            )
        except openai.OpenAIError as exc:
            if self._metrics:
                self._metrics.model_errors.inc()
            raise as_model_error(exc) from exc
        except AnswerCutOff:
            if self._metrics:
                self._metrics.model_errors.inc()
            raise
        if isinstance(response, Completion):
            return response
        choices = response.get("choices") if isinstance(response, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise ModelUnavailable("the model endpoint answered without a choice: check model.base_url")
        choice = choices[0]
        message = _without_none(choice.get("message") or {})
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
        cached, written = _cache_counts(usage) if usage is not None else (0, 0)
        return Completion(
            message=message,
            prompt_tokens=(usage or {}).get("prompt_tokens") or 0,
            completion_tokens=(usage or {}).get("completion_tokens") or 0,
            finish_reason=choice.get("finish_reason"),
            cached_tokens=cached, cache_write_tokens=written, reported=usage is not None,
        )

    async def _streamed(self, body: dict, options: RequestOptions, on_text: Callable[[str], None]) -> Completion:
        """One streamed call, put together into a :class:`Completion`; text goes to ``on_text`` as it comes."""
        answer = _StreamedAnswer()
        # Chunks as plain JSON: building the SDK's ChatCompletionChunk model for each of them cost about
        # 0.2 ms a chunk (cProfile), 90 % of a streamed call's CPU; the SDK still does the HTTP, the
        # errors and the Server-Sent Events.
        stream = await self._client.post("/chat/completions", cast_to=ChatCompletion, body=body, options=options,
                                         stream=True, stream_cls=AsyncStream[object])
        try:
            async for chunk in stream:
                text = answer.add(chunk) if isinstance(chunk, dict) else ""
                if text:
                    on_text(text)
        except (openai.OpenAIError, OSError, asyncio.TimeoutError) as exc:
            if not answer.text:
                raise  # nothing shown yet: retried like any failed call
            raise AnswerCutOff(answer.text, _describe(exc)) from exc
        finally:
            await stream.close()
        if answer.finish_reason is None and answer.text:
            raise AnswerCutOff(answer.text, "the stream ended without a finish reason")
        return answer.completion()

    async def close(self) -> None:
        await self._client.close()


def _without_none(value: Any) -> Any:
    """``value`` with every None in its dicts left out (what the SDK's ``exclude_none`` did)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


class _StreamedAnswer:
    """The pieces of a streamed completion, put back together."""

    def __init__(self) -> None:
        self.text = ""
        self.extra: dict[str, Any] = {}  # reasoning and other fields a provider streams beside the text
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.cache_write_tokens = 0
        self.reported = False

    def add(self, chunk: dict) -> str:
        """Take one chunk (a ``chat.completion.chunk`` as JSON) in; the answer text it carried."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens") or 0
            self.completion_tokens = usage.get("completion_tokens") or 0
            self.cached_tokens, self.cache_write_tokens = _cache_counts(usage)
            self.reported = True
        text = ""
        for choice in (chunk.get("choices") or [])[:1]:
            delta = {k: v for k, v in (choice.get("delta") or {}).items() if v is not None}
            text = delta.pop("content", None) or ""
            self.text += text
            for call in delta.pop("tool_calls", None) or []:
                self._add_tool_call(call)
            for key in ("role", "refusal", "function_call"):
                delta.pop(key, None)
            for key, value in delta.items():
                earlier = self.extra.get(key)
                if isinstance(earlier, str) and isinstance(value, str):
                    self.extra[key] = earlier + value
                elif isinstance(earlier, list) and isinstance(value, list):
                    earlier.extend(value)
                else:
                    self.extra[key] = value
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return text

    def _add_tool_call(self, delta: dict) -> None:
        call = self.tool_calls.setdefault(delta.get("index", 0), {"id": "", "type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def completion(self) -> Completion:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None, **self.extra}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return Completion(message=message, prompt_tokens=self.prompt_tokens,
                          completion_tokens=self.completion_tokens, finish_reason=self.finish_reason,
                          cached_tokens=self.cached_tokens, cache_write_tokens=self.cache_write_tokens,
                          reported=self.reported)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    refused = _connect_error(exc)  # the aiohttp transport reports a refused connection as a timeout
    if refused is not None:
        return "connection refused" if isinstance(refused, ConnectionRefusedError) else "connection failed"
    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__


def _connect_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind a failed connection (refused, unreachable), if there is one."""
    chain: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    errors = [e for e in chain if isinstance(e, OSError) and not isinstance(e, TimeoutError)]
    return next((e for e in errors if isinstance(e, ConnectionRefusedError)), errors[0] if errors else None)
