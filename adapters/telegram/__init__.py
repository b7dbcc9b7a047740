"""Telegram on python-telegram-bot: long polling or webhooks, HTML replies, forum topics as threads.

Modules: ``adapter`` (lifecycle, inbound delivery, sending), ``polling``
(offset advanced only past stored updates), ``webhook`` (our aiohttp
endpoint with the secret header check), ``events`` (Message -> InboundMessage),
``format`` (Markdown -> Telegram HTML), ``redact`` (token kept out of logs),
``config`` (the ``platforms.telegram`` settings).
"""

from adapters import lazy_exports

from .config import TelegramConfig

__all__ = ["TelegramAdapter", "TelegramConfig"]
__getattr__ = lazy_exports(__name__, {"TelegramAdapter": ".adapter"})
