"""Keep tokens out of discord.py's log records.

discord.py logs request URLs (a follow-up URL carries the interaction token:
``/webhooks/<app>/<token>``) and, at debug level, whole gateway events
(``INTERACTION_CREATE`` carries ``"token"``).  :func:`install` puts the
gateway's redacting filter (:func:`gateway.logging_setup.protect_loggers`,
whose token shapes cover both) on the library's loggers, and has it mask the
bot token too.
"""

from __future__ import annotations

from gateway.logging_setup import protect_loggers, redact

_LOGGERS = ("discord.client", "discord.gateway", "discord.http", "discord.state", "discord.webhook.async_",
            "discord.interactions", "discord.app_commands.tree")


def install(*secrets: str) -> None:
    """Filter discord.py's loggers (idempotent); ``secrets`` are masked verbatim too."""
    protect_loggers(_LOGGERS, *secrets)


def describe(exc: BaseException) -> str:
    """A one-line, token-free description of ``exc`` for logs and Delivery errors."""
    name = type(exc).__name__
    text = str(exc)
    return redact(f"{name}: {text}" if text and text != name else name)
