"""OpenTelemetry traces of each turn (the ``switchboard[otel]`` extra); nothing at all without it.

    tracing.setup(include_content=False)      # the daemon, once: on when OTEL_* names an OTLP endpoint
    with tracing.inbound(msg) as t:           # a new trace: the platform's event, stored
        ticket.trace = t.context
    with tracing.turn([ticket.trace, ...]):   # the turn, a child of the first message's event
        with tracing.model_call("gpt-4o", "api.openai.com") as call:
            ...; call.finished(input_tokens=..., output_tokens=..., finish_reason="stop")
        with tracing.tool_call("memory", "call_1", arguments) as tool:
            ...; tool.result(text)
        with tracing.send("telegram", "reply") as sent:
            ...; sent.outcome(ok, error)
    tracing.shutdown()                        # at exit: the last spans are sent

One trace per turn: the inbound event is its root (``inbound <platform>``), the turn its child
(``turn``; several messages answered together are links), and under the turn, as they happen:
each model call (``chat <model>``, the GenAI semantic conventions: ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.response.finish_reasons``; a streamed
answer has a ``gen_ai.first_token`` event), each tool call (``execute_tool <name>``), each platform
send (``send <platform>``, drafts and their edits too), and each store write (``store <method>``,
through :func:`state.aio.observe_writes`): an event on the span it happened in, with its duration,
or a span of its own when it took 50 ms or more or failed (a span costs the SDK about ten times
what an event does, and a turn makes several writes that take a millisecond).  The trace id goes into every log line written
inside (``trace_id=``, see :mod:`gateway.logging_setup`).

Configured by the standard environment variables, read by the OpenTelemetry SDK itself:
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP/protobuf;
traces stay off until one of them is set, so nothing is sent to a default address unasked),
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME`` (default ``switchboard``),
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn them off.

Message text (prompts, answers, tool arguments and results) never goes into a span unless
``telemetry.include_content`` is true.  When tracing is off, or the extra is not installed, every
function here returns one shared do-nothing object: no span, no allocation, no clock read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from importlib.metadata import PackageNotFoundError, version as package_version
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from gateway.types import InboundMessage

log = logging.getLogger(__name__)

try:  # the switchboard[otel] extra
    from opentelemetry import context as otel_context, trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - the extra is part of the test install
    trace = None  # type: ignore[assignment]

__all__ = ["available", "current_trace_id", "detached", "enabled", "inbound", "model_call", "send", "setup", "shutdown",
           "store_write", "tool_call", "turn"]

MAX_CONTENT_CHARS = 4096  # telemetry.include_content: text in a span is cut here


class _Noop:
    """What every function returns while tracing is off: a context manager and a recorder that do nothing."""

    context = None

    def __enter__(self) -> "_Noop":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def finished(self, **_: Any) -> None:
        pass

    def stream(self, on_text: Callable[[str], None] | None) -> Callable[[str], None] | None:
        return on_text

    def result(self, text: Any) -> None:
        pass

    def outcome(self, ok: bool, error: str | None = None) -> None:
        pass


NOOP = _Noop()

_provider: Any = None
_tracer: Any = None
_include_content = False


def available() -> bool:
    """Whether the ``switchboard[otel]`` extra is installed."""
    return trace is not None


def enabled() -> bool:
    return _tracer is not None


def requested(env: dict[str, str] | os._Environ) -> bool:
    """Whether these variables ask for traces (``make run`` then installs the extra when it is missing)."""
    return _wanted(env) is None


def _wanted(env: dict[str, str] | os._Environ) -> str | None:
    """Why traces stay off under these variables, or None when they are on."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "OTEL_SDK_DISABLED is true"
    exporters = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()]
    if "otlp" not in exporters:
        return f"OTEL_TRACES_EXPORTER is {env.get('OTEL_TRACES_EXPORTER')!r} (only otlp is built in)"
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return "no OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set"
    return None


def _version() -> str:
    try:
        return package_version("switchboard")
    except PackageNotFoundError:
        return "unknown"


def setup(*, include_content: bool = False, env: dict[str, str] | None = None) -> bool:
    """Turn traces on when the extra is installed and ``OTEL_*`` names an endpoint; returns whether they are."""
    global _provider, _tracer, _include_content
    env_vars = os.environ if env is None else env
    if _tracer is not None:
        return True
    why_off = _wanted(env_vars)
    if why_off is not None:
        log.debug("traces are off: %s", why_off)
        return False
    if trace is None:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry packages are not installed: "
                    "pip install 'switchboard[otel]' to send traces")
        return False
    version = _version()
    attributes = {"service.version": version}
    if not env_vars.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "switchboard"
    _provider = TracerProvider(resource=Resource.create(attributes))
    endpoint = env_vars.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        env_vars["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"  # as the SDK reads them
    # headers, timeout, compression, certificates: the exporter reads its OTEL_EXPORTER_OTLP_* itself
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = _provider.get_tracer("switchboard", version)
    _include_content = include_content
    log.info("traces: on, OTLP over HTTP to %s%s", endpoint, " (with message text: telemetry.include_content)" if include_content else "")
    return True


def shutdown() -> None:
    """Send what is still queued and stop (blocking: call it on a thread from async code)."""
    global _provider, _tracer, _include_content
    provider, _provider, _tracer, _include_content = _provider, None, None, False
    if provider is not None:
        provider.shutdown()


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the span running in this context, or None (also when the sampler
    did not keep its trace: a log line never points at a trace nobody can find)."""
    if _tracer is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid and ctx.trace_flags.sampled else None


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:MAX_CONTENT_CHARS]


class _Span:
    """A started span as the callers see it: the recorder methods of :class:`_Noop`, for real."""

    def __init__(self, name: str, kind: Any, attributes: dict[str, Any], *, parent: Any = None,
                 links: Iterable[Any] = ()):
        self._manager = _tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes,
                                                      links=list(links))
        self.span: Any = None

    @property
    def context(self) -> Any:
        return self.span.get_span_context() if self.span is not None else None

    def __enter__(self) -> "_Span":
        self.span = self._manager.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._manager.__exit__(*exc)

    def finished(self, *, input_tokens: int, output_tokens: int, finish_reason: str | None,
                 response_model: str | None = None, text: str | None = None) -> None:
        attributes: dict[str, Any] = {"gen_ai.usage.input_tokens": input_tokens,
                                      "gen_ai.usage.output_tokens": output_tokens}
        if finish_reason:
            attributes["gen_ai.response.finish_reasons"] = (finish_reason,)
        if response_model:
            attributes["gen_ai.response.model"] = response_model
        if _include_content and text:
            attributes["gen_ai.output.messages"] = _text([{"role": "assistant", "content": text}])
        self.span.set_attributes(attributes)  # one call: the SDK takes its lock once

    def stream(self, on_text: Callable[[str], None] | None) -> Callable[[str], None] | None:
        """``on_text`` that marks the first streamed text with a ``gen_ai.first_token`` event."""
        if on_text is None:
            return None
        span, first = self.span, [True]

        def feed(delta: str) -> None:
            if first[0] and delta:
                first[0] = False
                span.add_event("gen_ai.first_token")
            on_text(delta)

        return feed

    def result(self, text: Any) -> None:
        if _include_content:
            self.span.set_attribute("gen_ai.tool.call.result", _text(text))

    def outcome(self, ok: bool, error: str | None = None) -> None:
        if not ok:
            self.span.set_status(Status(StatusCode.ERROR, error or "not delivered"))


class _Detached:
    """No span is current inside (a task started here begins outside every trace)."""

    def __enter__(self) -> "_Detached":
        self._token = otel_context.attach(otel_context.Context())
        return self

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)


def detached() -> _Detached | _Noop:
    """For a long-lived task started inside a span (a chat's lane worker, which answers many turns): it
    should not carry that span (and its trace id in the logs) into everything it does later."""
    return NOOP if _tracer is None else _Detached()


def inbound(msg: "InboundMessage") -> _Span | _Noop:
    """The root of a turn's trace: a platform's (or the API's) message, taken and stored."""
    if _tracer is None:
        return NOOP
    attributes: dict[str, Any] = {"switchboard.platform": msg.platform, "switchboard.chat.type": msg.chat_type}
    if _include_content:
        attributes["switchboard.message.text"] = _text(msg.text)
    return _Span(f"inbound {msg.platform}", SpanKind.CONSUMER, attributes, parent=otel_context.Context())


def turn(parents: list[Any], *, platform: str) -> _Span | _Noop:
    """The turn answering the messages whose inbound spans are ``parents`` (the first is its parent)."""
    if _tracer is None:
        return NOOP
    found = [p for p in parents if p is not None]
    parent = trace.set_span_in_context(NonRecordingSpan(found[0])) if found else None
    return _Span("turn", SpanKind.INTERNAL, {"switchboard.platform": platform, "switchboard.messages": len(parents)},
                 parent=parent, links=[Link(p) for p in found[1:]])


def model_call(model: str, server: str | None, messages: list[dict] | None = None) -> _Span | _Noop:
    """One call of one model (a fallback's call is a span of its own): GenAI semantic conventions."""
    if _tracer is None:
        return NOOP
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                                  "gen_ai.system": "openai", "gen_ai.request.model": model}
    if server:
        attributes["server.address"] = server
    if _include_content and messages is not None:
        attributes["gen_ai.input.messages"] = _text(messages[-8:])
    return _Span(f"chat {model}", SpanKind.CLIENT, attributes)


def tool_call(name: str, call_id: str | None, arguments: Any = None) -> _Span | _Noop:
    if _tracer is None:
        return NOOP
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if _include_content and arguments is not None:
        attributes["gen_ai.tool.call.arguments"] = _text(arguments)
    return _Span(f"execute_tool {name}", SpanKind.INTERNAL, attributes)


def send(platform: str, what: str = "message") -> _Span | _Noop:
    """A send to a platform inside a turn: ``message`` (a reply or a notice), ``draft`` or ``edit``."""
    if _tracer is None or not trace.get_current_span().get_span_context().is_valid:
        return NOOP
    return _Span(f"send {platform}", SpanKind.PRODUCER, {"switchboard.platform": platform, "switchboard.send": what})


class _StoreWrite:
    """One store write inside a turn: an event on the span running it (``store <method>``, with
    ``db.operation.name`` and ``switchboard.duration_ms``), which costs a tenth of a span; a write that
    took ``SLOW_STORE_WRITE_SECONDS`` or more, or failed, becomes a child span of its own instead, with
    the write's own start and end, so a slow turn shows where its store time went."""

    __slots__ = ("_parent", "_method", "_started")

    def __init__(self, parent: Any, method: str):
        self._parent = parent
        self._method = method

    def __enter__(self) -> "_StoreWrite":
        self._started = time.time_ns()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ended = time.time_ns()
        name = "store " + self._method
        # (a write that outlives its span, e.g. from a task the turn left behind, becomes a span too)
        if exc is None and ended - self._started < _SLOW_STORE_WRITE_NS and self._parent.is_recording():
            self._parent.add_event(name, {"db.operation.name": self._method,
                                          "switchboard.duration_ms": (ended - self._started) / 1e6},
                                   timestamp=self._started)
            return
        span = _tracer.start_span(name, context=trace.set_span_in_context(self._parent), kind=SpanKind.CLIENT,
                                  attributes={"db.operation.name": self._method}, start_time=self._started)
        if exc is not None:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200] or type(exc).__qualname__))
        span.end(end_time=ended)


SLOW_STORE_WRITE_SECONDS = 0.05  # a store write that took this long (waiting its turn included) is a span of its own
_SLOW_STORE_WRITE_NS = int(SLOW_STORE_WRITE_SECONDS * 1e9)


def store_write(method: str) -> _StoreWrite | _Noop:
    """A write to the store inside a turn (``state.aio.observe_writes``); nothing outside one."""
    if _tracer is None:
        return NOOP
    parent = trace.get_current_span()
    context = parent.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:  # outside a turn, or a trace not kept
        return NOOP
    return _StoreWrite(parent, method)
