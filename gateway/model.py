"""The model endpoint: any OpenAI-compatible server through the ``openai`` SDK.

:class:`ModelClient` bounds concurrent calls (``model.max_concurrent_calls``),
retries 429, 5xx, connection errors and timeouts with exponential backoff and
jitter (honouring ``Retry-After``) within ``model.retry_total_seconds``, and
raises :class:`gateway.errors.ModelUnavailable` after the last failure.  A
refusal (400 for context length, 401, 403, 404) is not retried and raises
its own subclass (:func:`as_model_error`), so the user is told what to fix.
The SDK's own retries are off so there is one policy, ours.

With ``model.fallbacks`` a call that fails that way (or on a model the endpoint does not know)
goes on to the next model of the chain, at once for a refused connection, a timeout or a 429
asking to wait longer than ``model.max_wait_seconds``; the rules are :mod:`gateway.fallback`'s.
Each model keeps its own health and breaker (:meth:`ModelClient.endpoints`, for ``/healthz``,
``/metrics`` and ``doctor``).

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
import dataclasses
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp
import openai
from openai import AsyncStream, RequestOptions
from openai.types.chat import ChatCompletion

import compression
from gateway import tracing
from gateway.errors import (
    AnswerCutOff,
    AttachmentRefused,
    ContextTooLong,
    EmptyAnswer,
    ModelAuthRejected,
    ModelForbidden,
    ModelNotFound,
    ModelRefused,
    ModelUnavailable,
)
from gateway.fallback import Breaker, Capabilities, ChainSettings, Endpoint, lacking, move_on_now, probe_until_back
from gateway.modelprobe import probe_models
from gateway.oversize import max_message_tokens, shorten_oversized
from gateway.retry import Backoff, retry_async
from gateway.tasks import spawn
from gateway.usage import OTHER, CallContext, ModelCall, Outcome, UsageRecorder

if TYPE_CHECKING:
    from gateway.budgetgate import BudgetGate
    from gateway.config import Config

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
    #: the model that answered: a name under ``models`` (``alt``, a fallback's), or the model name the
    #: ``default`` endpoint was asked for (``model.name``, or a chat's ``/model`` name on it)
    answered_by: str | None = None
    # True: the prompt was fitted to the window here (messages cut or left out), so ``prompt_tokens`` is not
    # the size of the prompt the caller built
    fitted: bool = False


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


_ATTACHMENT_WORDS = re.compile(r"\b(images?|files?|pictures?|attachments?)\b")


def _names_attachment(exc: openai.APIStatusError) -> bool:
    """A refusal that names a picture or a file (OpenAI: ``invalid_image_format``, ``image_parse_error``;
    others say "Invalid image", "Failed to load image", "unsupported file type")."""
    said = " ".join(str(part or "") for part in (getattr(exc, "code", None), getattr(exc, "type", None),
                                                 getattr(exc, "param", None), exc.message)).lower()
    return _ATTACHMENT_WORDS.search(said.replace("_", " ")) is not None


# "This model's maximum context length is 2048 tokens": the wording OpenAI, vLLM and llama.cpp share
_WINDOW_SAID = re.compile(r"maximum context length is (\d[\d,]*) tokens", re.IGNORECASE)
MIN_LEARNED_WINDOW = 256  # a number below this is not taken for a window


def named_window(exc: openai.APIStatusError) -> int | None:
    """The context window a context-length error names, if it names one (llama.cpp's ``n_ctx`` too)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    n_ctx = error.get("n_ctx") if isinstance(error, dict) else None
    if isinstance(n_ctx, int) and n_ctx >= MIN_LEARNED_WINDOW:
        return n_ctx
    said = _WINDOW_SAID.search(exc.message or "")
    window = int(said.group(1).replace(",", "")) if said else None
    return window if window is not None and window >= MIN_LEARNED_WINDOW else None


def as_model_error(exc: BaseException) -> ModelUnavailable:
    """The gateway's error for the client's last failure: a typed refusal for a 4xx that
    says what to fix, else :class:`ModelUnavailable` (a later message may work)."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (400, 413) and _is_context_length(exc):
            return ContextTooLong(status, f"HTTP {status}: context length exceeded", named_window(exc))
        if status in (400, 413, 415, 422) and _names_attachment(exc):
            code = getattr(exc, "code", None)
            return AttachmentRefused(status, f"HTTP {status}: {code or 'a picture or file was refused'}")
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
DEFAULT_LABEL = "default"  # the ``model`` section's name in the chain (gateway.config.DEFAULT_MODEL)
PROBE_EVERY_SECONDS = 2.0  # at most one reachability probe this often while the endpoint is down


@dataclass(slots=True)
class EndpointHealth:
    """What the last calls (or a probe) said of the endpoint: ``ok``, ``unknown`` (no call yet),
    ``unreachable`` (the last call failed to connect, timed out or kept failing) or ``not_serving``
    (the probe at start found a server that is not this model's API: a 404 at /models, another
    model, a refused key), since when, and why."""

    state: str = "unknown"
    since: float | None = None
    last_error: str | None = None

    def as_dict(self) -> dict:
        return {"state": self.state, "since": self.since, "last_error": self.last_error}


class _Endpoint:
    """One model of the chain as the client holds it: its own HTTP client, health and breaker."""

    def __init__(self, endpoint: Endpoint, breaker_seconds: float, max_calls: int):
        settings = endpoint.settings
        assert isinstance(settings, ModelSettings)
        self.label = endpoint.label
        self.settings = settings
        self.host = urlsplit(str(settings.base_url)).hostname  # server.address of its traces' spans
        self.capabilities = endpoint.capabilities
        self.client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key or "not-needed",
            timeout=settings.timeout_seconds,
            max_retries=0,
            http_client=http_client(max_calls),
        )
        self.health = EndpointHealth()
        self.breaker = Breaker(breaker_seconds)
        self.prober: asyncio.Task | None = None
        self.probed_at = 0.0
        self.window: int | None = None  # the configured (or assumed) context window; None: prompts not fitted
        self.learned: int | None = None  # the window its server named this run (a context-length error)
        self.variables: tuple[str | None, str | None] = (None, None)  # what set base_url and name (check_at_start)

    @property
    def fits_in(self) -> int | None:
        return self.learned or self.window

    def note(self, ok: bool, error: str | None = None) -> None:
        if ok and self.health.state != "ok":
            self.health = EndpointHealth("ok", time.time())
        elif not ok:
            since = self.health.since if self.health.state == "unreachable" else time.time()
            self.health = EndpointHealth("unreachable", since, error)

    async def answers(self, listed_too: bool = True) -> bool:
        """Whether ``GET /models`` answers below 500 (and, ``listed_too``, lists ours when it lists any)."""
        try:
            listed = await self.client.get("/models", cast_to=object, options={"timeout": 3.0})
        except openai.APIStatusError as exc:
            return exc.status_code < 500
        except (openai.OpenAIError, OSError, asyncio.TimeoutError):
            return False
        names = {m.get("id") for m in listed.get("data") or [] if isinstance(m, dict)} \
            if isinstance(listed, dict) and isinstance(listed.get("data"), list) else set()
        return not listed_too or not names or self.settings.name in names

    def as_dict(self) -> dict:
        return {**self.health.as_dict(), "model": self.settings.name, "breaker": self.breaker.state,
                "base_url": str(self.settings.base_url)}

    async def check_at_start(self, http: aiohttp.ClientSession) -> str | None:
        """One ``GET /models`` at start: the health it finds (``ok``, ``unreachable``, or ``not_serving``:
        it answers but not as this model's API), and a warning naming the URL and what to try."""
        probe = await probe_models(http, str(self.settings.base_url), self.settings.api_key)
        problem = probe.problem(self.settings.name)
        if problem is None:
            if self.health.state == "unknown":
                self.health = EndpointHealth("ok", time.time())
            return None
        if self.health.state == "unknown":  # a call that came first knows better
            state = "unreachable" if not probe.reachable else "not_serving"
            self.health = EndpointHealth(state, time.time(), problem)
        key = "model" if self.label == DEFAULT_LABEL else f"models.{self.label}"
        return f"model {self.label}: {problem}; {probe.fix(self.settings.name, key, self.variables)}"

    def window_dict(self) -> dict:
        """The window prompts are fitted to, and, once the server named one, the config line to add."""
        out: dict[str, Any] = {"context_length": self.window, "learned": self.learned}
        if self.learned is not None and self.learned != self.window:
            key = "model" if self.label == DEFAULT_LABEL else f"models.{self.label}"
            out["fix"] = f"set {key}.context_length: {self.learned} in the config (the server said so)"
        return out


def _falls_back(exc: BaseException) -> bool:
    """Whether a call's failure sends it to the next model: unreachable, timed out, failing (5xx after the
    retries, a long 429) or a model the endpoint does not know; not a refusal of this request
    (a prompt too long, a bad key) nor an answer cut off after the user saw some of it."""
    if isinstance(exc, ModelNotFound):
        return True
    return isinstance(exc, ModelUnavailable) and not isinstance(exc, (ModelRefused, AnswerCutOff))


class ModelClient:
    def __init__(self, settings: ModelSettings, *, metrics=None, usage: UsageRecorder | None = None,
                 backoff: Backoff = Backoff(base=0.5, cap=20.0), capabilities: Capabilities | None = None,
                 fallbacks: Sequence[Endpoint] = (), chain: ChainSettings | None = None,
                 named: Sequence[Endpoint] = (), budgets: BudgetGate | None = None,
                 windows: Mapping[str, int] | None = None, max_message_share: float = 0.5):
        self.settings = settings
        self._budgets = budgets  # asked before every call (gateway.budgetgate); None: no budgets
        self._metrics = metrics
        self._usage = usage  # the ledger: one row per call; None: not recorded
        self._backoff = backoff
        self._chain = chain = chain or ChainSettings()
        first = Endpoint(DEFAULT_LABEL, settings, capabilities or Capabilities())
        self._endpoints = [_Endpoint(e, chain.breaker_seconds, settings.max_concurrent_calls)
                           for e in (first, *fallbacks)]
        self._primary = self._endpoints[0]
        # the named models outside the chain: a call may start on one (a chat's /model), never falls back to one
        self._chosen = [_Endpoint(e, chain.breaker_seconds, settings.max_concurrent_calls) for e in named
                        if e.label not in {f.label for f in fallbacks}]
        self._client = self._primary.client
        self._slots = asyncio.Semaphore(settings.max_concurrent_calls)
        # every call's prompt is fitted to its model's window (the configured one, or the one its server
        # named this run); a model without one here is sent prompts as they are
        for endpoint in (*self._endpoints, *self._chosen):
            endpoint.window = (windows or {}).get(endpoint.label)
        self._max_message_share = max_message_share
        # told (label, model name, window) when a server named a window: the daemon notes it for ``doctor``
        self.on_learned: Callable[[str, str, int], object] | None = None

    @property
    def health(self) -> EndpointHealth:
        """The ``model`` section's endpoint (``default``)."""
        return self._primary.health

    async def check_at_start(self, variables: Callable[[str], str | None] = lambda key: None) -> list[str]:
        """Probe every endpoint once (at start, concurrently, a few seconds at most): the health each
        shows at once in ``/healthz``, and a warning per endpoint that is down or does not serve its
        model, naming the URL and what to try (``variables(key)``: the variable that set a key)."""
        endpoints = (*self._endpoints, *self._chosen)
        for endpoint in endpoints:
            key = "model" if endpoint.label == DEFAULT_LABEL else f"models.{endpoint.label}"
            endpoint.variables = (variables(f"{key}.base_url"), variables(f"{key}.name"))
        async with aiohttp.ClientSession(trust_env=False) as http:
            found = await asyncio.gather(*(e.check_at_start(http) for e in endpoints))
        return [warning for warning in found if warning]

    def endpoints(self) -> dict[str, dict]:
        """Each model of the chain, in order: its state, since when, last error, model name and breaker."""
        return {e.label: e.as_dict() for e in (*self._endpoints, *self._chosen)}

    def windows(self) -> dict[str, dict]:
        """Each model's context window: configured, learned from its server this run, the line to add."""
        return {e.label: e.window_dict() for e in (*self._endpoints, *self._chosen)}

    def learned_window(self, model: str | None) -> int | None:
        """The window the server of ``model`` (a label; None: ``default``) named this run, if any."""
        endpoint = next((e for e in (*self._endpoints, *self._chosen) if e.label == (model or DEFAULT_LABEL)), None)
        return endpoint.learned if endpoint is not None else None

    async def probe(self) -> EndpointHealth:
        """While the last call said an endpoint is down, see (at most every few seconds, with a
        short timeout) whether it answers ``GET /models`` again; any answer below 500 counts.
        Returns the ``default`` endpoint's health."""
        now = time.monotonic()
        for endpoint in (*self._endpoints, *self._chosen):
            if endpoint.health.state != "unreachable" or now - endpoint.probed_at < PROBE_EVERY_SECONDS:
                continue
            endpoint.probed_at = now
            if await endpoint.answers(listed_too=False):
                endpoint.note(True)
        return self.health

    async def back(self, within: float, every: float = PROBE_EVERY_SECONDS) -> bool:
        """Wait until the ``default`` endpoint, seen down, answers again (probed every ``every`` seconds);
        False after ``within`` seconds without it.  What holds a chat's messages through an outage."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await asyncio.sleep(every)
            if (await self.probe()).state != "unreachable":
                return True
        return False

    def _order(self, model: str | None, messages: list[dict], tools: list[dict] | None) -> list[tuple[_Endpoint, str]]:
        """The models this call tries, in order: the one asked for (a name under ``models``, else a model
        name for the ``default`` endpoint), then the fallbacks that have what it needs; those whose
        breaker is open go last."""
        first = next((e for e in (*self._endpoints, *self._chosen) if e.label == model), self._primary)
        asked = model if first is self._primary and model and model != DEFAULT_LABEL else None
        chain = [(first, asked or first.settings.name)]
        for endpoint in self._endpoints[1:]:
            if endpoint is first:
                continue
            missing = lacking(endpoint.capabilities, messages, tools)
            if missing:
                log.debug("fallback %s skipped: it lacks %s", endpoint.label, missing)
                continue
            chain.append((endpoint, endpoint.settings.name))
        if len(chain) == 1:
            return chain
        return [c for c in chain if not c[0].breaker.is_open] + [c for c in chain if c[0].breaker.is_open]

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
        on_model: Callable[[str], None] | None = None,
    ) -> Completion:
        """One model call (retried as the module docstring says), on the first model of the chain that
        answers; ``purpose`` is what the usage ledger records it as; ``params`` are request fields of
        :data:`PASSED_PARAMS` (temperature, response_format, ...) sent as they are.  ``on_model`` is told
        each model the call tries as it starts on it (the last one told is the one whose text streams),
        and the completion names the one that answered (``answered_by``)."""
        order = self._order(model, messages, tools)
        admission = None
        if self._budgets is not None:  # every call asks first: refused (BudgetExceeded), or its answer capped
            admission = await self._budgets.admit(purpose, order[0][1], messages, _asked_max_tokens(params))
            params = _capped(params, admission.max_tokens)
        try:
            for i, (endpoint, name) in enumerate(order):
                last = i == len(order) - 1
                answering = name if endpoint is self._primary else endpoint.label
                if on_model is not None:
                    on_model(answering)
                try:
                    completion = await self._fitted_call(
                        endpoint, name, last, messages, tools, timeout, on_text, purpose, params,
                        admission.scopes if admission is not None else ())
                    return dataclasses.replace(completion, answered_by=answering)
                except ModelUnavailable as exc:
                    if not _falls_back(exc):
                        raise
                    self._keep_out(endpoint)
                    if last:
                        raise
                    log.warning("model %s failed (%s): trying %s", endpoint.label, exc, order[i + 1][0].label)
                    if self._metrics:
                        self._metrics.model_fallbacks.labels(endpoint.label).inc()
            raise AssertionError("unreachable: the chain has at least one model")
        finally:
            if self._budgets is not None:
                self._budgets.release(admission)

    async def _fitted_call(self, endpoint: _Endpoint, name: str, last: bool, messages: list[dict],
                           tools: list[dict] | None, timeout: float | None, on_text: Callable[[str], None] | None,
                           purpose: CallContext, params: dict[str, Any] | None, scopes: tuple[str, ...]) -> Completion:
        """One call on ``endpoint`` with the prompt fitted to its window.  When the server says the window is
        smaller (a context-length error naming it, or an empty answer cut by ``finish_reason: length``), that
        window is this model's for the rest of the run, and the call is fitted to it and made once more."""
        for attempt in range(2):
            sent = self._fitted(endpoint, messages, params)
            try:
                with tracing.model_call(name, endpoint.host, sent) as call:
                    completion = await self._complete_on(endpoint, name, last, sent, tools, timeout,
                                                         call.stream(on_text), purpose, params, scopes)
                    call.finished(input_tokens=completion.prompt_tokens, output_tokens=completion.completion_tokens,
                                  finish_reason=completion.finish_reason, text=completion.message.get("content"))
            except ContextTooLong as exc:
                if attempt or not self._learn(endpoint, exc.window, "a context-length error"):
                    raise
                continue
            if completion.message.get("content") or completion.message.get("tool_calls"):
                return dataclasses.replace(completion, fitted=True) if sent is not messages else completion
            if completion.finish_reason == "length" and not attempt and not _asked_max_tokens(params):
                # nothing written before the window ran out: the prompt all but filled it (no cap was asked
                # for, so the answer's own limit is not what cut it)
                filled = completion.prompt_tokens + completion.completion_tokens if completion.reported \
                    else compression.estimate_tokens(sent)
                if (endpoint.fits_in is None or filled < endpoint.fits_in) and \
                        self._learn(endpoint, filled, "an empty answer cut off by the window"):
                    continue
            raise EmptyAnswer(f"the model sent an empty answer (finish_reason: {completion.finish_reason})")
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _learn(self, endpoint: _Endpoint, window: int | None, how: str) -> bool:
        """Take ``window`` as ``endpoint``'s for this run; False when it tells nothing new (the call is not made again)."""
        if window is None or window < MIN_LEARNED_WINDOW or window == endpoint.learned:
            return False
        if endpoint.fits_in is not None and window >= endpoint.fits_in and endpoint.learned is None \
                and window == endpoint.window:
            return False  # the window we fitted to already: fitting again would send the same prompt
        endpoint.learned = window
        if self.on_learned is not None:
            self.on_learned(endpoint.label, endpoint.settings.name, window)
        key = "model" if endpoint.label == DEFAULT_LABEL else f"models.{endpoint.label}"
        log.warning("model %s: its server says the context window is %d tokens (%s), not the %s assumed: prompts "
                    "are fitted to it from now on; set %s.context_length: %d in the config", endpoint.label, window,
                    how, f"{endpoint.window:,}" if endpoint.window else "unknown", key, window)
        return True

    def _fitted(self, endpoint: _Endpoint, messages: list[dict], params: dict[str, Any] | None) -> list[dict]:
        """``messages`` fitted to ``endpoint``'s window with room for the answer: oversized messages cut to
        their start and end, then the oldest middle turns left out (the store is untouched)."""
        window = endpoint.fits_in
        if window is None:
            return messages
        reserve = min(_asked_max_tokens(params) or RESERVE_FOR_ANSWER, window // 8)
        limit = window - reserve
        before = compression.estimate_tokens(messages)
        if before <= limit:
            return messages
        cap = max_message_tokens(window, self._max_message_share)
        fitted, dropped = compression.fit_to_window(shorten_oversized(messages, cap).messages, window,
                                                    reserve_tokens=reserve)
        while compression.estimate_tokens(fitted) > limit and cap > 64:  # a few huge messages: cut them harder
            cap //= 2
            fitted = shorten_oversized(fitted, cap).messages
        log.info("a prompt of ~%d tokens was fitted to %s's %d-token window (~%d tokens, %d messages left out)",
                 before, endpoint.label, window, compression.estimate_tokens(fitted), dropped)
        return fitted

    def _keep_out(self, endpoint: _Endpoint) -> None:
        """Open ``endpoint``'s breaker (when there is a chain to leave it out of) and probe it in the background."""
        if len(self._endpoints) == 1:
            return
        endpoint.breaker.open()
        if endpoint.prober is None or endpoint.prober.done():
            endpoint.prober = spawn(self._probe_back(endpoint), name=f"model-probe:{endpoint.label}")

    async def _probe_back(self, endpoint: _Endpoint) -> None:
        async def answers() -> bool:
            ok = await endpoint.answers()
            if ok:
                endpoint.note(True)
                log.info("model %s answers again: back in the chain", endpoint.label)
            return ok

        await probe_until_back(answers, endpoint.breaker, self._chain.probe_every_seconds)

    async def _complete_on(self, endpoint: _Endpoint, name: str, last: bool, messages: list[dict],
                           tools: list[dict] | None, timeout: float | None, on_text: Callable[[str], None] | None,
                           purpose: CallContext, params: dict[str, Any] | None,
                           scopes: tuple[str, ...] = ()) -> Completion:
        """One call on one model of the chain, retried there; recorded in the ledger under ``name``
        (and its spend under the budget ``scopes``)."""
        started, clock = time.monotonic(), self._usage.clock() if self._usage is not None else 0.0
        attempts = [1]
        streams = on_text is not None and endpoint.capabilities.streaming
        try:
            try:
                completion = await self._complete(endpoint, name, last, messages, tools, timeout,
                                                  on_text if streams else None, attempts, params)
            except _EmptyStream:
                # an empty stream is a failed call: asked again unstreamed, whose answer (or error) says more
                log.warning("model %s: the stream ended with no text and no finish reason; asking again unstreamed",
                            endpoint.label)
                attempts[0] += 1
                streams = False
                completion = await self._complete(endpoint, name, last, messages, tools, timeout, None, attempts,
                                                  params)
        except ModelRefused as exc:
            endpoint.note(True)  # it answered: reachable, it just refused this request
            self._record(purpose, name, messages, started, clock, attempts[0], None, exc, scopes)
            raise
        except ModelUnavailable as exc:
            if not isinstance(exc, AnswerCutOff):
                endpoint.note(False, str(exc))
            self._record(purpose, name, messages, started, clock, attempts[0], None, exc, scopes)
            raise
        except BaseException as exc:
            self._record(purpose, name, messages, started, clock, attempts[0], None, exc, scopes)
            raise
        endpoint.note(True)
        self._record(purpose, name, messages, started, clock, attempts[0], completion, None, scopes)
        if on_text is not None and not streams and completion.message.get("content"):
            on_text(completion.message["content"])  # a model that does not stream: its answer in one piece
        return completion

    def _record(self, purpose: CallContext, model: str, messages: list[dict], started: float, clock: float,
                attempts: int, completion: Completion | None, failure: BaseException | None,
                scopes: tuple[str, ...] = ()) -> None:
        if self._usage is None:
            return
        try:
            cached = written = 0
            if completion is not None and completion.reported:
                prompt_tokens, completion_tokens, estimated = completion.prompt_tokens, completion.completion_tokens, False
                cached, written = completion.cached_tokens, completion.cache_write_tokens
            elif completion is None and failure is not None and not _reached_model(failure):
                prompt_tokens = completion_tokens = 0  # refused, never sent, or an error answer: costs nothing
                estimated = False
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
                context=purpose, model=model, at=clock,
                latency_ms=(time.monotonic() - started) * 1000, outcome=outcome, attempts=attempts, error=error,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached,
                cache_write_tokens=written, estimated=estimated, budget_scopes=scopes))
        except Exception:  # the ledger never fails a model call
            log.exception("usage ledger: the call could not be recorded")

    async def _complete(self, endpoint: _Endpoint, model: str, last: bool, messages: list[dict],
                        tools: list[dict] | None, timeout: float | None, on_text: Callable[[str], None] | None,
                        attempts: list[int], params: dict[str, Any] | None = None) -> Completion:
        body: dict[str, Any] = {k: v for k, v in (params or {}).items() if k in PASSED_PARAMS}
        body.update({"model": model, "messages": messages})
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
                    return await self._streamed(endpoint.client, body, options, on_text)
                # The SDK's typed ``chat.completions.create`` re-walks every message through its
                # TypedDict transformer (about 14 ms for a 20-message prompt, measured with
                # cProfile); our messages are already plain JSON, so post them as they are and
                # let the SDK do the rest (auth, HTTP, errors).  The answer is read as plain JSON
                # too: building its ChatCompletion model was about 0.5 ms of a turn's CPU.
                return await endpoint.client.post("/chat/completions", cast_to=object, body=body, options=options)

        def here(exc: BaseException) -> float | None:
            """The usual policy, except that with another model left some failures move on at once."""
            if not last and move_on_now(exc, self._chain.max_wait_seconds):
                return None
            return classify(exc)

        def on_retry(attempt: int, exc: BaseException, wait: float) -> None:
            attempts[0] = attempt + 1
            log.warning("model call to %s failed (%s), retry %d in %.1fs", endpoint.label, _describe(exc), attempt, wait)
            if self._metrics:
                self._metrics.model_retries.inc()

        try:
            response = await retry_async(
                call,
                classify=here,
                backoff=self._backoff,
                max_attempts=endpoint.settings.max_retries + 1,
                total_seconds=endpoint.settings.retry_total_seconds,
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

    async def _streamed(self, client: openai.AsyncOpenAI, body: dict, options: RequestOptions,
                        on_text: Callable[[str], None]) -> Completion:
        """One streamed call, put together into a :class:`Completion`; text goes to ``on_text`` as it comes."""
        answer = _StreamedAnswer()
        # Chunks as plain JSON: building the SDK's ChatCompletionChunk model for each of them cost about
        # 0.2 ms a chunk (cProfile), 90 % of a streamed call's CPU; the SDK still does the HTTP, the
        # errors and the Server-Sent Events.
        stream = await client.post("/chat/completions", cast_to=ChatCompletion, body=body, options=options,
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
        if answer.finish_reason is None and not answer.tool_calls:
            # llama.cpp's server answers an over-window streamed request with 200 and no event at all
            raise _EmptyStream()
        return answer.completion()

    async def close(self) -> None:
        for endpoint in (*self._endpoints, *self._chosen):
            if endpoint.prober is not None:
                endpoint.prober.cancel()
            await endpoint.client.close()


def _asked_max_tokens(params: dict[str, Any] | None) -> int | None:
    """The cap on the answer the caller asked for, if any (``max_completion_tokens`` or ``max_tokens``)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = (params or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _capped(params: dict[str, Any] | None, max_tokens: int | None) -> dict[str, Any] | None:
    """``params`` with the answer capped at ``max_tokens`` (what a budget still allows)."""
    if max_tokens is None:
        return params
    capped = dict(params or {})
    capped["max_tokens"] = max_tokens
    if "max_completion_tokens" in capped:
        capped["max_completion_tokens"] = max_tokens
    return capped


def _without_none(value: Any) -> Any:
    """``value`` with every None in its dicts left out (what the SDK's ``exclude_none`` did)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


class _EmptyStream(EmptyAnswer):
    """A stream that ended with no text, no tool call and no finish reason (asked again unstreamed)."""


# Tokens of a window kept for the answer when a prompt is fitted here (at most an eighth of it).  This is
# the safety net under every call; a turn's prompt was already fitted (and compressed) with more room.
RESERVE_FOR_ANSWER = 512


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


def _reached_model(failure: BaseException) -> bool:
    """Whether a failed call may have cost tokens: it was sent and the model may have read it (an answer
    cut off, a read that timed out, a call cancelled on its way), so the prompt is counted.  Not a
    refused or failed connection, a timeout before the request was sent, nor an HTTP error answer (a
    429, a 5xx, a 4xx refusal: the endpoint reports no usage with one, and the model did not answer)."""
    if isinstance(failure, AnswerCutOff):
        return True
    cause = failure.__cause__
    if isinstance(cause, openai.APIStatusError):
        return False
    if isinstance(cause, openai.APIConnectionError):
        if _connect_error(cause) is not None or not isinstance(cause, openai.APITimeoutError):
            return False
        return not _timed_out_connecting(cause)
    return True


def _timed_out_connecting(exc: BaseException) -> bool:
    """Whether a timeout came before the request was sent (connecting, or waiting for a pooled connection)."""
    cause: BaseException | None = exc
    for _ in range(8):
        if cause is None:
            return False
        if type(cause).__name__ in ("ConnectTimeout", "PoolTimeout", "ConnectionTimeoutError"):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _connect_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind a failed connection (refused, unreachable), if there is one."""
    chain: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    errors = [e for e in chain if isinstance(e, OSError) and not isinstance(e, TimeoutError)]
    return next((e for e in errors if isinstance(e, ConnectionRefusedError)), errors[0] if errors else None)


def model_client(cfg: Config, *, metrics=None, usage: UsageRecorder | None = None,
                 budgets: BudgetGate | None = None) -> ModelClient:
    """The client for ``cfg``'s chain: ``model`` (named ``default``), then ``model.fallbacks`` from ``models``."""
    m = cfg.model

    def settings(base_url: str, api_key: str, name: str) -> ModelSettings:
        return ModelSettings(base_url=str(base_url), api_key=api_key, name=name, timeout_seconds=m.timeout_seconds,
                             max_concurrent_calls=m.max_concurrent_calls, max_retries=m.max_retries,
                             retry_total_seconds=m.retry_total_seconds)

    named = {label: Endpoint(label, settings(n.base_url, n.api_key, n.name), Capabilities(n.vision, n.tools, n.streaming))
             for label, n in cfg.models.items()}
    windows = {label: compression.context_length_for(n.name, n.context_length)[0] for label, n in cfg.models.items()}
    windows[DEFAULT_LABEL] = compression.context_length_for(m.name, m.context_length)[0]
    return ModelClient(settings(m.base_url, m.api_key, m.name), metrics=metrics, usage=usage,
                       windows=windows, max_message_share=m.max_message_share,
                       capabilities=Capabilities(m.vision, m.tools, m.streaming),
                       fallbacks=[named[label] for label in m.fallbacks], named=list(named.values()), budgets=budgets,
                       chain=ChainSettings(max_wait_seconds=m.max_wait_seconds, breaker_seconds=m.breaker_seconds))
