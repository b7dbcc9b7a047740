"""Feishu / Lark adapter (the long connection in lark-oapi's protocol, or HTTP callbacks).

    adapter = LarkAdapter(LarkConfig(app_id="cli_...", app_secret="..."))   # cfg.platforms.lark

Modules: :mod:`.adapter` (lifecycle, inbound events, sends, card drafts), :mod:`.connection` (the long
connection's frames, and why not the SDK's client), :mod:`.callback` (``mode: http``: a callback
decrypted and checked), :mod:`.sdk` (the two parts of lark-oapi used, without its ``__init__``),
:mod:`.api` (the open API: tenant token,
messages, resources), :mod:`.events` (event -> chat type / ids, mentions, files; pure),
:mod:`.format` (Markdown as a card), :mod:`.config` (the ``platforms.lark`` settings).
"""

from adapters import lazy_exports

from .config import LarkConfig

__all__ = ["LarkAdapter", "LarkConfig"]
__getattr__ = lazy_exports(__name__, {"LarkAdapter": ".adapter"})
