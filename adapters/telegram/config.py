"""``platforms.telegram``: the bot token, the Bot API address, and long polling or a webhook.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from gateway.config import HttpUrl, KeyedError, OptionalHttpUrl, PlatformConfig, secret_field
from gateway.types import Capabilities, CredentialCheck, SetupGuide, SetupValue

__all__ = ["TelegramConfig"]


class TelegramConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "telegram"
    # 4,096 UTF-16 units after entity parsing; about one message a second into a chat (groups: 20 a
    # minute, the adapter's GROUP_RATE); forum topics are threads; inline keyboards are buttons
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=True, reactions=False, files=True, voice=True,
        max_message_length=4096, length_unit="utf16", chat_rate=1.0, chat_burst=2)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Telegram",
        ("In Telegram, open @BotFather, send /newbot, pick a name and a username ending in 'bot'.",
         "BotFather answers with the bot's token (digits:letters): paste it here."),
        (SetupValue("token", "TELEGRAM_BOT_TOKEN", "Telegram bot token"),),
        "copy it again from @BotFather (/mybots -> your bot -> API Token)",
        base_key="base_url", base_variable="TELEGRAM_BASE_URL")
    token: str = secret_field()
    base_url: HttpUrl = "https://api.telegram.org/bot"  # python-telegram-bot appends the token
    base_file_url: OptionalHttpUrl = None  # None: derived from base_url (.../bot -> .../file/bot)
    poll_timeout: int = Field(30, ge=0, le=120)  # long-polling getUpdates timeout, seconds
    max_image_bytes: int = Field(5 * 1024 * 1024, ge=1)  # larger photos are not downloaded for vision
    webhook_url: OptionalHttpUrl = None  # unset: long polling
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(8443, ge=0, le=65535)
    webhook_secret: str = secret_field()

    @field_validator("webhook_secret")
    @classmethod
    def _telegram_secret_charset(cls, value: str) -> str:
        # Telegram's rule for secret_token; the value itself is never echoed.
        if value and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", value):
            raise ValueError("must be 1-256 characters from A-Z a-z 0-9 _ - (Telegram's rule); generate one with: openssl rand -hex 32")
        return value

    @model_validator(mode="after")
    def _half_configured(self) -> TelegramConfig:
        if self.enabled and not self.token and (self.webhook_url or self.webhook_secret):
            raise KeyedError("token", "is not set but webhook settings are; set TELEGRAM_BOT_TOKEN (the token from @BotFather), or remove the webhook keys")
        return self

    TARGET_FORM: ClassVar[str] = "telegram:<chat_id>[:<topic_id>]"
    LIBRARY: ClassVar[str | None] = "telegram"  # python-telegram-bot, the switchboard[telegram] extra

    def credential_problem(self) -> str | None:
        return None if self.token else "platforms.telegram.token is not set"

    def credential_check(self) -> CredentialCheck:
        return CredentialCheck("POST", f"{self.base_url}{self.token}/getMe", {},
                               lambda status, body: body.get("ok") and "@" + str(body["result"].get("username")))

    @classmethod
    def check_target(cls, chat: str, thread: str | None) -> str | None:
        if not re.fullmatch(r"-?\d+|@[A-Za-z]\w{3,}", chat):
            return f"telegram chat ids are numbers, or @name for a public channel (got {chat!r}); write {cls.TARGET_FORM}"
        if thread is not None and not thread.isdigit():
            return f"a telegram topic id is a number (got {thread!r})"
        return None
