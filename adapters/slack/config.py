"""``platforms.slack``: the bot token plus Socket Mode's app token or HTTP mode's signing secret.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gateway.config import HttpUrl, KeyedError, PlatformConfig, describe, secret_field
from gateway.types import Capabilities, CredentialCheck, SetupGuide, SetupValue

__all__ = ["SlackConfig"]


class SlackConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "slack"
    # 3,900 characters a message (Slack truncates display around 4,000); about one message a second
    # into a channel; threads, Block Kit buttons, the typing reaction, files and voice clips
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=True, reactions=True, files=True, voice=True,
        max_message_length=3900, chat_rate=1.0, chat_burst=2, button_message_length=3000)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Slack",
        ("api.slack.com/apps -> Create New App -> From scratch; Socket Mode: on (an app-level token with "
         "connections:write, xapp-...); Event Subscriptions: message.im, app_mention (docs/first-bot-slack.md).",
         "OAuth & Permissions: scopes chat:write, app_mentions:read, im:history, users:read; Install to "
         "Workspace; copy the Bot User OAuth Token (xoxb-...)."),
        (SetupValue("bot_token", "SLACK_BOT_TOKEN", "Slack bot token (xoxb-...)", prefix="xoxb-",
                    where="api.slack.com/apps -> your app -> OAuth & Permissions -> Bot User OAuth Token"),
         SetupValue("app_token", "SLACK_APP_TOKEN", "Slack app-level token (xapp-...)", prefix="xapp-",
                    where="api.slack.com/apps -> your app -> Basic Information -> App-Level Tokens (scope "
                          "connections:write)")),
        "copy the Bot User OAuth Token (xoxb-...) again: api.slack.com/apps -> your app -> OAuth & Permissions",
        base_key="api_base_url", base_variable="SLACK_API_BASE_URL")
    TARGET_FORM: ClassVar[str] = "slack:<channel_id>[:<thread_ts>]"
    LIBRARY: ClassVar[str | None] = "slack_bolt"  # slack-bolt and slack-sdk, the switchboard[slack] extra
    bot_token: str = secret_field()  # xoxb-...
    app_token: str = secret_field()  # xapp-..., socket mode
    signing_secret: str = secret_field()  # http mode
    mode: Literal["socket", "http"] = "socket"
    http_port: int = Field(3000, ge=0, le=65535)
    http_path: str = "/slack/events"
    api_base_url: HttpUrl = "https://slack.com/api/"
    # streamed replies in threads with Slack's chat.startStream/appendStream/stopStream (AI apps);
    # off: chat.update, which every workspace has; any error of those methods falls back to it
    native_streaming: bool = False

    @field_validator("http_path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f'must start with "/", like /slack/events (got {describe(value)})')
        return value

    @model_validator(mode="after")
    def _half_configured(self) -> SlackConfig:
        if not self.enabled:
            return self
        needed = "app_token" if self.mode == "socket" else "signing_secret"
        how = {
            "app_token": "an app-level token xapp-... with connections:write (or set mode: http with signing_secret)",
            "signing_secret": "the app's signing secret from Basic Information (or use mode: socket with app_token)",
        }[needed]
        if self.bot_token and not getattr(self, needed):
            raise KeyedError(needed, f"is not set but bot_token is; {self.mode} mode needs {how}")
        if not self.bot_token and (self.app_token or self.signing_secret):
            raise KeyedError("bot_token", "is not set but other Slack credentials are; set SLACK_BOT_TOKEN (xoxb-...) or remove them")
        return self

    def credential_problem(self) -> str | None:
        return None if self.bot_token else "platforms.slack.bot_token is not set"

    def credential_check(self) -> CredentialCheck:
        return CredentialCheck("POST", f"{str(self.api_base_url).rstrip('/')}/auth.test",
                               {"Authorization": f"Bearer {self.bot_token}"},
                               lambda status, body: body.get("ok") and f"{body.get('team')} as {body.get('user')}")
