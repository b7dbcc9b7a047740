"""Logging for the daemon and the CLI: readable lines on a terminal, JSON lines
otherwise, and no secret ever written.

    setup_logging(cfg.logging.level, cfg.logging.format, secrets=cfg.secrets())

One handler on the root logger writes to stderr.  A :class:`RedactingFilter`
on that handler (so it sees every record that propagates, including those of
httpx, discord.py and the Slack SDK) replaces each known secret value and
anything shaped like a token (the shapes of :func:`compression.redaction.redact_tokens`)
with ``***`` in the message, its arguments, the
exception text and the stack; the formatters then mask their final output
once more, which catches secrets in ``extra=`` fields.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any, Iterable, TextIO

from compression.redaction import redact_tokens
from gateway import tracing

__all__ = ["JsonFormatter", "Redactor", "RedactingFilter", "TextFormatter", "protect_loggers", "redact", "setup_logging"]

MASK = "***"
# A known secret shorter than this is not masked: replacing e.g. "ab"
# everywhere would shred the logs while protecting nothing worth having.
MIN_SECRET_LENGTH = 6

# Tokens are masked even when the config does not know them (a token in an
# exception from a library, a user pasting one into a chat...): their shapes are
# the one catalogue in compression.redaction (redact_tokens).  Besides those, a
# credential is recognised by where it stands in HTTP traffic; each pattern's
# first group is kept (the "Bearer " before the token).
TOKEN_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),  # Authorization: Bearer <token>
    re.compile(r"(?i)(\bbot\s+)[A-Za-z0-9._-]{20,}"),  # Authorization: Bot <token> (Discord)
    re.compile(r"(?i)([?&](?:token|access_token|api_key|key|secret)=)[^&\s#\"']+"),  # tokens in query strings
    re.compile(r"(/(?:webhooks|interactions)/[0-9]+/)[A-Za-z0-9_.-]+"),  # Discord interaction/webhook token in a URL
    re.compile(r"""(["']token["']\s*:\s*["'])[^"']+"""),  # "token": "..." in a logged payload (Discord events)
)

_MASK_AFTER_PREFIX = r"\1" + MASK

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys() | {"message", "asctime", "taskName"}
)


class Redactor:
    """Masks known secret values and token-shaped strings in text."""

    def __init__(self, secrets: Iterable[str] = ()):
        self._secrets: set[str] = set()
        self._known: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str) -> None:
        """Mask these values too (shorter than ``MIN_SECRET_LENGTH``: ignored)."""
        new = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH} - self._secrets
        if new:
            self._secrets |= new
            values = sorted(self._secrets, key=len, reverse=True)
            self._known = re.compile("|".join(re.escape(v) for v in values))

    def __call__(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(MASK, text)
        text = redact_tokens(text, MASK)
        for pattern in TOKEN_PATTERNS:
            text = pattern.sub(_MASK_AFTER_PREFIX, text)
        return text

    def value(self, value: Any) -> Any:
        """Mask inside strings, and strings inside lists and dicts (for ``extra=`` fields)."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


class RedactingFilter(logging.Filter):
    """Rewrites each record so no secret survives in message, args, exception or stack."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor
        self._exc_formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad %-format call: keep what we have, still masked
            message = f"{record.msg} {record.args!r}"
        record.msg = self.redactor(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._exc_formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor(record.stack_info)
        return True


# For the platform libraries, which log tokens before any handler of ours sees the record (request
# URLs carrying the bot token, gateway payloads carrying interaction tokens), and for the adapters'
# error texts: one redactor for the process, fed by each adapter with its own token.
_LIBRARY_REDACTOR = Redactor()
_LIBRARY_FILTER = RedactingFilter(_LIBRARY_REDACTOR)


def protect_loggers(names: Iterable[str], *secrets: str) -> None:
    """Mask ``secrets`` and every token shape in the records of the loggers ``names`` (the loggers
    themselves, so whatever handler a record reaches sees it masked).  Idempotent."""
    _LIBRARY_REDACTOR.add(*secrets)
    for name in names:
        logger = logging.getLogger(name)
        if _LIBRARY_FILTER not in logger.filters:
            logger.addFilter(_LIBRARY_FILTER)


def redact(text: str) -> str:
    """``text`` with every secret given to :func:`protect_loggers` and every token shape masked."""
    return _LIBRARY_REDACTOR(text)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """``2026-11-22 01:02:03,456 INFO    gateway.router: message key=value``."""

    def __init__(self, redactor: Redactor):
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            tail = " ".join(f"{k}={v}" for k, v in extras.items())
            head, sep, rest = line.partition("\n")
            line = f"{head} {tail}{sep}{rest}"
        return self.redactor(line)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``{"ts", "level", "logger", "msg", ...extra, "exc"?, "stack"?}``."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            out.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        # Mask the values before encoding: JSON escaping could split a secret.
        return json.dumps(self.redactor.value(out), ensure_ascii=False, default=lambda v: self.redactor(str(v)))


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` (the turn's OpenTelemetry trace, see :mod:`gateway.tracing`) to the records
    written inside one; the formatters show it as ``trace_id=...`` / a JSON field.  Nothing while
    tracing is off."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = tracing.current_trace_id()
        if trace_id is not None:
            record.trace_id = trace_id
        return True


class _SwitchboardHandler(logging.StreamHandler):
    """Marks our handler so a second setup_logging() replaces it instead of doubling output."""


# HTTP clients that log every request at INFO (httpx2 is the openai SDK's aiohttp transport): a line per model call
QUIET_PER_REQUEST = ("httpx", "httpcore", "httpx2")
# The platform libraries' own DEBUG lines hold what people write ("Calling Bot API endpoint sendMessage
# with parameters {'text': ...}", request bodies): kept at INFO even at DEBUG, so a debug log carries
# no message text.  Our own modules' DEBUG lines say what they do without it.
NO_MESSAGE_TEXT = ("telegram", "discord.http", "discord.gateway", "discord.webhook", "slack_sdk", "slack_bolt")


def setup_logging(
    level: str = "INFO",
    fmt: str = "auto",
    secrets: Iterable[str] = (),
    *,
    stream: TextIO | None = None,
) -> None:
    """Send every log record to ``stream`` (default stderr), masked.

    ``fmt``: ``"text"``, ``"json"``, or ``"auto"`` (text when the stream is a
    terminal, JSON lines otherwise).  Calling it again replaces the handler,
    e.g. once the config's secrets are known.  Below DEBUG, the HTTP
    clients' one-line-per-request logging (every model call) is kept at WARNING.
    """
    if fmt not in ("auto", "text", "json"):
        raise ValueError(f"log format must be auto, text or json (got {fmt!r})")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"log level must be DEBUG, INFO, WARNING, ERROR or CRITICAL (got {level!r})")
    stream = sys.stderr if stream is None else stream
    if fmt == "auto":
        isatty = getattr(stream, "isatty", None)
        fmt = "text" if isatty is not None and isatty() else "json"

    secrets = list(secrets)
    redactor = Redactor(secrets)
    handler = _SwitchboardHandler(stream)
    handler.addFilter(RedactingFilter(redactor))
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(TextFormatter(redactor) if fmt == "text" else JsonFormatter(redactor))

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _SwitchboardHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric)
    quiet = logging.WARNING if numeric > logging.DEBUG else logging.NOTSET
    for name in QUIET_PER_REQUEST:
        logging.getLogger(name).setLevel(quiet)
    for name in NO_MESSAGE_TEXT:  # above DEBUG they follow the root's level, as before
        logging.getLogger(name).setLevel(logging.INFO if numeric <= logging.DEBUG else logging.NOTSET)
    short = sum(1 for s in set(secrets) if s and len(s) < MIN_SECRET_LENGTH)
    if short:
        logging.getLogger(__name__).warning(
            "%d configured secret(s) are shorter than %d characters and are not masked in logs; use longer secrets",
            short,
            MIN_SECRET_LENGTH,
        )
