"""``platforms.webhook``: named hooks, each with its secret, its senders, its field paths and its callback.

    platforms:
      webhook:
        hooks:
          n8n:
            secret: ${N8N_HOOK_SECRET}            # HMAC-SHA256 key, both ways
            callback_url: https://n8n.example/webhook/switchboard-reply
            allowed_senders: [alice]              # webhook:n8n/alice may talk to the agent
            fields: {sender: user.id, conversation: thread, text: message.text, idempotency_key: id}

Published to the gateway under the ``switchboard.adapter_configs`` entry point; docs/webhooks.md
describes the requests and the signatures.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.config import KeyedError, OptionalHttpUrl, PlatformConfig, describe, secret_field
from gateway.types import Capabilities

__all__ = ["HookConfig", "HookFields", "WebhookConfig"]

HOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
FIELD_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")


class HookFields(BaseModel):
    """Where the request body holds each part (dotted paths: ``message.text``, ``items.0.id``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sender: str = "sender"
    conversation: str = "conversation"  # absent from a body: the sender's own conversation
    text: str = "text"
    idempotency_key: str = "id"  # absent: the Idempotency-Key header, else the signed timestamp and body

    @field_validator("sender", "conversation", "text", "idempotency_key")
    @classmethod
    def _path(cls, value: str) -> str:
        if not FIELD_PATH.match(value):
            raise ValueError(f"must be a dotted path into the JSON body, like message.text (got {describe(value)})")
        return value


class HookConfig(BaseModel):
    """One hook: ``POST /webhooks/<name>`` on the local API."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)
    secret: str = secret_field()
    callback_url: OptionalHttpUrl = None  # where replies are POSTed; unset: only answered to a request that waits
    allowed_senders: tuple[str, ...] = ()
    fields: HookFields = HookFields()
    wait: bool = False  # every request waits for its reply (a request may also ask: ?wait=1)


class WebhookConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "webhook"
    # the local API's paths this platform answers (gateway.runtime.platform_http mounts them)
    HTTP_PATHS: ClassVar[tuple[str, ...]] = ("/webhooks/{name}",)
    # a reply is one POST (or one answer); nothing is edited, threaded or pressed
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=False, threads=False, buttons=False, typing=False, reactions=False, files=False, voice=False,
        groups=False, max_message_length=16000, chat_rate=5.0, chat_burst=5)
    TARGET_FORM: ClassVar[str] = "webhook:<hook>[:<conversation>]"
    require_mention: bool = False
    hooks: dict[str, HookConfig] = {}
    max_skew_seconds: int = Field(300, ge=5, le=3600)  # a signature older (or newer) than this is refused
    wait_seconds: float = Field(30.0, gt=0, le=600)  # the longest a waiting request is held for its reply
    callback_timeout_seconds: float = Field(10.0, gt=0, le=120)
    callback_attempts: int = Field(5, ge=1, le=20)
    callback_budget_seconds: float = Field(60.0, gt=0, le=3600)

    @field_validator("hooks")
    @classmethod
    def _names(cls, value: dict[str, HookConfig]) -> dict[str, HookConfig]:
        for name, hook in value.items():
            if not HOOK_NAME.match(name):
                raise KeyedError(name, "a hook's name is 1-64 letters, digits, _ or -, starting with a letter or digit")
            if not hook.secret:
                raise KeyedError(f"{name}.secret", "is not set; every hook needs its own secret "
                                                   "(generate one with: openssl rand -hex 32)")
            for i, sender in enumerate(hook.allowed_senders):
                if not sender.strip() or "/" in sender or any(c.isspace() for c in sender):
                    raise KeyedError(f"{name}.allowed_senders.{i}", f"must be a sender id without spaces or / "
                                                                    f"(got {describe(sender)})")
        return value

    @model_validator(mode="after")
    def _senders_are_users(self) -> WebhookConfig:
        # a hook's sender is the user "<hook>/<sender>" to auth and pairing, so one hook's allowed
        # sender is nobody on another hook
        extra = tuple(f"{name}/{s}" for name, hook in self.hooks.items() for s in hook.allowed_senders)
        if extra:
            object.__setattr__(self, "allowed_users", tuple(dict.fromkeys((*self.allowed_users, *extra))))
        return self

    def credential_problem(self) -> str | None:
        return None if self.hooks else "platforms.webhook.hooks is empty"

    async def probe(self, timeout: float) -> tuple[bool, str, str] | None:
        names = ", ".join(f"/webhooks/{name}" for name in self.hooks)
        return True, f"on: {len(self.hooks)} hook(s) on the local API ({names}); the senders sign their requests", ""

    @classmethod
    def check_target(cls, chat: str, thread: str | None) -> str | None:
        if not HOOK_NAME.match(chat):
            return f"a hook's name is letters, digits, _ or - (got {chat!r}); write {cls.TARGET_FORM}"
        return None
