"""Keeping the bot token out of logs, and reading PTB's errors.

The Bot API puts the token in every URL, so ``httpx`` (INFO: "HTTP Request:
POST .../bot<token>/getUpdates") and PTB (DEBUG: "Set Bot API URL") would log
it.  :func:`install_redaction` adds a filter to those loggers that replaces the
token before any handler sees the record.
"""

from __future__ import annotations

import datetime as dtm
import logging
import warnings

from telegram.error import RetryAfter

_LIBRARY_LOGGERS = ("httpx", "httpcore", "telegram", "telegram.Bot", "telegram.request", "telegram.ext")


class TokenRedactor(logging.Filter):
    """Replaces every registered secret in a record's message with ``<redacted>``."""

    def __init__(self) -> None:
        super().__init__("switchboard-redact")
        self.secrets: set[str] = set()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "<redacted>")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a broken record is the logger's problem, not ours
                return True
            clean = self.redact(message)
            if clean != message:
                record.msg, record.args = clean, None
        return True


_REDACTOR = TokenRedactor()


def install_redaction(secret: str) -> None:
    """Redact ``secret`` from the HTTP and PTB loggers (and any ``telegram.*`` logger already created)."""
    _REDACTOR.secrets.add(secret)
    names = set(_LIBRARY_LOGGERS)
    names.update(n for n in logging.root.manager.loggerDict if n.startswith(("telegram", "httpx", "httpcore")))
    for name in names:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)


def redact(text: str) -> str:
    """``text`` with every registered token replaced."""
    return _REDACTOR.redact(text)


def describe(exc: BaseException) -> str:
    """A one-line, token-free description of a library error."""
    return redact(f"{type(exc).__name__}: {exc}")


def retry_after_seconds(exc: BaseException) -> float | None:
    """Seconds Telegram asked us to wait (``RetryAfter``), else None."""
    if not isinstance(exc, RetryAfter):
        return None
    with warnings.catch_warnings():  # PTB 22 warns that this will become a timedelta
        warnings.simplefilter("ignore")
        value = exc.retry_after
    if isinstance(value, dtm.timedelta):
        return value.total_seconds()
    return float(value)
