"""Feishu / Lark adapter (the long connection, lark-oapi's protocol).

    adapter = LarkAdapter.from_config(cfg.platforms.lark, commands=COMMANDS, vision=cfg.model.vision)

Modules: :mod:`.adapter` (lifecycle, inbound events, sends, card drafts), :mod:`.connection` (the long
connection's frames, and why not the SDK's client), :mod:`.api` (the open API: tenant token,
messages, resources), :mod:`.events` (event -> chat type / ids, mentions, files; pure),
:mod:`.format` (Markdown as a card), :mod:`.config` (the ``platforms.lark`` settings).
"""

from adapters import lazy_exports

from .config import LarkConfig

__all__ = ["LarkAdapter", "LarkConfig"]
__getattr__ = lazy_exports(__name__, {"LarkAdapter": ".adapter"})
