"""Discord adapter (discord.py 2.7).

    from adapters.discord import DiscordAdapter
    adapter = DiscordAdapter(DiscordConfig(token=...), commands=[("help", "Show commands")])
    await adapter.start(handler)

The package is named like the library; every module here imports the
library with absolute imports (``import discord``), which resolve to
discord.py, never to this package.  ``config`` holds the ``platforms.discord``
settings; the adapter (and discord.py) is imported on first use.
"""

from __future__ import annotations

from adapters import lazy_exports

from .config import DiscordConfig

__all__ = ["BAD_TOKEN_HELP", "MESSAGE_CONTENT_HELP", "DiscordAdapter", "DiscordConfig"]
__getattr__ = lazy_exports(__name__, {name: ".adapter" for name in ("BAD_TOKEN_HELP", "MESSAGE_CONTENT_HELP", "DiscordAdapter")})
