"""Keep tokens out of discord.py's log records.

discord.py logs request URLs (a follow-up URL carries the interaction token:
``/webhooks/<app>/<token>``) and, at debug level, whole gateway events
(``INTERACTION_CREATE`` carries ``"token"``).  :func:`install` puts a filter
on the library's loggers that rewrites those records, and also removes any
bot token registered with it.
"""

from __future__ import annotations

import logging
import re

_LOGGERS = ("discord.client", "discord.gateway", "discord.http", "discord.state", "discord.webhook.async_",
            "discord.interactions", "discord.app_commands.tree")
_PATTERNS = (
    (re.compile(r"(/(?:webhooks|interactions)/\d+/)[A-Za-z0-9_.\-]+"), r"\1***"),
    (re.compile(r"""(['"]token['"]\s*:\s*['"])[^'"]+"""), r"\1***"),
)


class _Redactor(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the library's problem, not a reason to drop it
            return True
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if self.redact(str(exc)) != str(exc):
                record.exc_text = self.redact(logging.Formatter().formatException(record.exc_info))
        return True


_REDACTOR = _Redactor()


def install(*secrets: str) -> None:
    """Filter discord.py's loggers (idempotent); ``secrets`` are removed verbatim too."""
    _REDACTOR.secrets.update(s for s in secrets if s)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)


def redact(text: str) -> str:
    """``text`` with every known secret and token pattern replaced."""
    return _REDACTOR.redact(text)


def describe(exc: BaseException) -> str:
    """A one-line, token-free description of ``exc`` for logs and Delivery errors."""
    name = type(exc).__name__
    text = str(exc)
    return redact(f"{name}: {text}" if text and text != name else name)
