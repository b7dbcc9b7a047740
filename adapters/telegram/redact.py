"""Keeping the bot token out of logs, and reading PTB's errors.

The Bot API puts the token in every URL, so ``httpx`` (INFO: "HTTP Request:
POST .../bot<token>/getUpdates") and PTB (DEBUG: "Set Bot API URL") would log
it.  :func:`install_redaction` puts the gateway's redacting filter
(:func:`gateway.logging_setup.protect_loggers`) on those loggers, so the token
is masked before any handler sees the record.
"""

from __future__ import annotations

import datetime as dtm
import logging
import warnings

from telegram.error import RetryAfter

from gateway.logging_setup import protect_loggers, redact

_LIBRARY_LOGGERS = ("httpx", "httpcore", "telegram", "telegram.Bot", "telegram.request", "telegram.ext")


def install_redaction(secret: str) -> None:
    """Redact ``secret`` from the HTTP and PTB loggers (and any ``telegram.*`` logger already created)."""
    names = set(_LIBRARY_LOGGERS)
    names.update(n for n in logging.root.manager.loggerDict if n.startswith(("telegram", "httpx", "httpcore")))
    protect_loggers(sorted(names), secret)


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
