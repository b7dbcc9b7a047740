"""Microsoft Teams adapter (the Bot Framework protocol, spoken directly).

    adapter = TeamsAdapter(TeamsConfig(app_id="...", app_password="..."))   # cfg.platforms.teams

Modules: :mod:`.adapter` (lifecycle, the messaging endpoint, sends, drafts, cards; why not the SDK),
:mod:`.auth` (the inbound JWT checked against the OpenID metadata, the bot's own token),
:mod:`.events` (activity -> chat type / ids, mentions, pure), :mod:`.format` (Markdown as Teams
renders it), :mod:`.outbound` (the connector calls: paced, retried), :mod:`.media` (files in),
:mod:`.config` (the ``platforms.teams`` settings).  The adapter (and PyJWT) is imported on first use.
"""

from adapters import lazy_exports

from .config import TeamsConfig

__all__ = ["TeamsAdapter", "TeamsConfig"]
__getattr__ = lazy_exports(__name__, {"TeamsAdapter": ".adapter"})
