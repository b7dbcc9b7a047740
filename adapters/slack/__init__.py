"""Slack adapter (slack-bolt async; Socket Mode or HTTP Events mode).

    adapter = SlackAdapter(SlackConfig(bot_token="xoxb-...", app_token="xapp-..."))       # Socket Mode
    adapter = SlackAdapter(SlackConfig(bot_token="xoxb-...", signing_secret="...", mode="http", http_port=3000))
    adapter = SlackAdapter.from_config(cfg.platforms.slack, commands=COMMANDS, vision=cfg.model.vision)

Modules: :mod:`.adapter` (lifecycle, inbound events, ack rules, threads),
:mod:`.events` (payload -> chat type / ids, pure), :mod:`.outbound`
(splitting, pacing, retries, response_url), :mod:`.mrkdwn` (Markdown <-> Slack text),
:mod:`.config` (the ``platforms.slack`` settings).  The adapter (and slack-bolt) is imported on first use.
"""

from adapters import lazy_exports

from .config import SlackConfig
from .mrkdwn import to_mrkdwn, to_plain

__all__ = ["SlackAdapter", "SlackConfig", "to_mrkdwn", "to_plain"]
__getattr__ = lazy_exports(__name__, {"SlackAdapter": ".adapter"})
