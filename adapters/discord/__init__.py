"""Discord adapter (discord.py 2.7).

    from adapters.discord import DiscordAdapter
    adapter = DiscordAdapter(token=..., commands=[("help", "Show commands")])
    await adapter.start(handler)

The package is named like the library; every module here imports the
library with absolute imports (``import discord``), which resolve to
discord.py, never to this package.
"""

from __future__ import annotations

from .adapter import BAD_TOKEN_HELP, MESSAGE_CONTENT_HELP, DiscordAdapter

__all__ = ["BAD_TOKEN_HELP", "MESSAGE_CONTENT_HELP", "DiscordAdapter"]
