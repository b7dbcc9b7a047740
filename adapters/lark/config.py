"""``platforms.lark``: the Feishu / Lark app's id and secret, the domain, and how events arrive.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.  ``base_url`` is the open platform's address:
``https://open.feishu.cn`` (Feishu, China) or ``https://open.larksuite.com`` (Lark), or a test fake.
Events come by the long connection (``mode: websocket``, the default: no public URL) or by HTTP
callbacks (``mode: http``) to ``/lark/events`` on the local API (``HTTP_PATHS``), which need the
console's Verification Token and Encrypt Key.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from gateway.config import KeyedError, OptionalHttpUrl, PlatformConfig, secret_field
from gateway.types import Capabilities, SetupGuide, SetupValue

__all__ = ["DOMAINS", "EVENTS_PATH", "LarkConfig"]

EVENTS_PATH = "/lark/events"

DOMAINS = {"feishu": "https://open.feishu.cn", "lark": "https://open.larksuite.com"}


class LarkConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "lark"
    # A card's Markdown holds about 30 KB; we send 4,000 characters a message.  The open API allows 5
    # messages a second into one chat (and a message about 5 edits a second); we keep to 2, bursts
    # of 3.  Topics (threads) are threads; card buttons; files, images and voice messages in.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=False, reactions=False, files=True, voice=True,
        max_message_length=4000, chat_rate=2.0, chat_burst=3)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Feishu/Lark",
        ("open.feishu.cn/app (Lark: open.larksuite.com/app, then set platforms.lark.domain: lark) -> Create Custom "
         "App -> Credentials & Basic Info: App ID and App Secret.",
         "Add the Bot feature; Events and Callbacks: receive events through the persistent connection, "
         "im.message.receive_v1."),
        (SetupValue("app_id", "LARK_APP_ID", "App ID (cli_...)", secret=False),
         SetupValue("app_secret", "LARK_APP_SECRET", "App Secret")),
        "copy the App ID and App Secret again (Credentials & Basic Info)",
        base_key="base_url", base_variable="LARK_BASE_URL")
    LIBRARY: ClassVar[str | None] = "lark_oapi"  # the switchboard[lark] extra
    # mode: http's event callbacks, on the local API's listener (gateway.runtime.platform_http mounts it)
    HTTP_PATHS: ClassVar[tuple[str, ...]] = (EVENTS_PATH,)
    app_id: str = ""  # cli_...
    app_secret: str = secret_field()
    domain: Literal["feishu", "lark"] = "feishu"
    base_url: OptionalHttpUrl = None  # unset: the domain's open platform
    mode: Literal["websocket", "http"] = "websocket"
    # mode: http only: the console's Events and Callbacks > Encryption Strategy
    verification_token: str = secret_field()
    encrypt_key: str = secret_field()
    max_file_bytes: int = Field(20 * 1024 * 1024, ge=1)

    @model_validator(mode="after")
    def _half_configured(self) -> LarkConfig:
        if not self.enabled:
            return self
        if self.app_secret and not self.app_id:
            raise KeyedError("app_id", "is not set but app_secret is; set LARK_APP_ID (cli_..., from the developer console)")
        if self.app_id and not self.app_secret:
            raise KeyedError("app_secret", "is not set but app_id is; set LARK_APP_SECRET (the app's credentials page)")
        if self.app_id and self.mode == "http":
            where = "from the console's Events and Callbacks > Encryption Strategy"
            if not self.verification_token:
                raise KeyedError("verification_token", f"is not set but mode is http; set LARK_VERIFICATION_TOKEN "
                                                       f"(the Verification Token {where})")
            if not self.encrypt_key:
                raise KeyedError("encrypt_key", f"is not set but mode is http; set LARK_ENCRYPT_KEY (the Encrypt "
                                                f"Key {where}; without one the platform neither encrypts nor signs "
                                                "its callbacks)")
        return self

    @property
    def api_base(self) -> str:
        return str(self.base_url or DOMAINS[self.domain]).rstrip("/")

    def connection_identity(self) -> str | None:
        """The long connection is one per app: one instance of a cluster holds it (``mode: http`` would not)."""
        return self.app_id if self.mode == "websocket" else None

    async def probe(self, timeout: float) -> tuple[bool, str, str] | None:
        """``switchboard doctor``: ask for a tenant token with these credentials."""
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.post(f"{self.api_base}/open-apis/auth/v3/tenant_access_token/internal",
                                 json={"app_id": self.app_id, "app_secret": self.app_secret}) as resp:
                body = await resp.json(content_type=None)
        body = body if isinstance(body, dict) else {}
        if body.get("code") == 0 and body.get("tenant_access_token"):
            return True, f"app secret valid (app {self.app_id} on {self.api_base})", ""
        return (False, f"the app secret was refused (code {body.get('code')}: {body.get('msg')})",
                "copy the App Secret from the developer console into platforms.lark.app_secret")

    def credential_problem(self) -> str | None:
        return None if self.app_id and self.app_secret else "platforms.lark.app_id is not set"
