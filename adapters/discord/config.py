"""``platforms.discord``: the bot token and, for tests and proxies, the REST and gateway addresses.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, BeforeValidator

from gateway.config import HttpUrl, PlatformConfig, check_url, empty_to_none, secret_field
from gateway.types import Capabilities, CredentialCheck, SetupGuide, SetupValue

__all__ = ["DiscordConfig"]

WebSocketUrl = Annotated[str, AfterValidator(check_url(("ws", "wss")))]


class DiscordConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "discord"
    STREAM_EDIT_INTERVAL: ClassVar[float] = 1.2  # Discord: 5 calls per 5 s in a channel
    # 2,000 characters a message; 5 sends or edits per 5 s in a channel (any 5 s window holds at most
    # burst + 5 x rate = 5); threads, components (buttons), attachments and voice messages
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=True, reactions=False, files=True, voice=True,
        max_message_length=2000, chat_rate=0.6, chat_burst=2)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Discord",
        ("discord.com/developers/applications -> New Application -> Bot: Reset Token (copy it), and turn on "
         "Message Content Intent.",
         "Then OAuth2 -> URL Generator: scope bot, permissions Send Messages + Read Message History; open the URL "
         "to invite it."),
        (SetupValue("token", "DISCORD_BOT_TOKEN", "Discord bot token"),),
        "copy it again: Developer Portal -> your application -> Bot -> Reset Token",
        base_key="api_base_url", base_variable="DISCORD_API_BASE_URL")
    token: str = secret_field()
    api_base_url: HttpUrl = "https://discord.com/api/v10"
    gateway_url: Annotated[WebSocketUrl | None, BeforeValidator(empty_to_none)] = None

    TARGET_FORM: ClassVar[str] = "discord:<channel_id>"
    LIBRARY: ClassVar[str | None] = "discord"  # discord.py, the switchboard[discord] extra
    TARGET_THREADS: ClassVar[bool] = False  # a thread is a channel of its own

    def credential_problem(self) -> str | None:
        return None if self.token else "platforms.discord.token is not set"

    def credential_check(self) -> CredentialCheck:
        return CredentialCheck("GET", f"{str(self.api_base_url).rstrip('/')}/users/@me",
                               {"Authorization": f"Bot {self.token}"},
                               lambda status, body: status == 200 and body.get("username"))

    @classmethod
    def check_target(cls, chat: str, thread: str | None) -> str | None:
        return None if chat.isdigit() else f"discord channel ids are numbers (got {chat!r}); write {cls.TARGET_FORM}"
