"""``platforms.whatsapp``: the Cloud API's access token and phone number id, the app secret that signs
webhooks, the verify token of the handshake, and the template sent outside
the 24-hour customer-service window.  Meta's webhook is served by the local API at ``/whatsapp/webhook``.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from gateway.config import HttpUrl, KeyedError, OptionalText, PlatformConfig, secret_field
from gateway.types import Capabilities, SetupGuide, SetupValue

__all__ = ["WhatsAppConfig"]


class WhatsAppConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "whatsapp"
    # 4,096 characters a text message; no edits, no threads, no groups in the Cloud API; up to three
    # reply buttons; reactions; a typing indicator with the read receipt; files and voice notes.
    # Meta's pair rate: a burst, then one message every 6 seconds to one user (error 131056 past it).
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=False, threads=False, buttons=True, typing=True, reactions=True, files=True, voice=True,
        groups=False, max_message_length=4096, chat_rate=1 / 6, chat_burst=20)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "WhatsApp",
        ("developers.facebook.com -> your Business app -> WhatsApp -> API Setup: the phone number id; Business "
         "Settings -> System users: a permanent token with whatsapp_business_messaging.",
         "App settings -> Basic: the app secret. The verify token is any long random string, typed again as the "
         "webhook's Verify token (docs/platforms.md, WhatsApp)."),
        (SetupValue("access_token", "WHATSAPP_ACCESS_TOKEN", "Access token"),
         SetupValue("phone_number_id", "WHATSAPP_PHONE_NUMBER_ID", "Phone number id", secret=False),
         SetupValue("app_secret", "WHATSAPP_APP_SECRET", "App secret"),
         SetupValue("verify_token", "WHATSAPP_VERIFY_TOKEN", "Verify token (any long random string)")),
        "check the access token (a system user's permanent token) and the phone number id (API Setup)",
        base_key="api_base_url", base_variable="WHATSAPP_API_BASE_URL")
    # Meta's webhook, on the local API's listener (gateway.runtime.platform_http mounts it); put a TLS
    # reverse proxy in front of the API for this path, Meta calls https only
    HTTP_PATHS: ClassVar[tuple[str, ...]] = ("/whatsapp/webhook",)
    access_token: str = secret_field()  # a system user's permanent token (whatsapp_business_messaging)
    phone_number_id: str = ""  # the business phone number's id (WhatsApp Manager > API setup)
    app_secret: str = secret_field()  # the Meta app's secret: every webhook POST is signed with it
    verify_token: str = secret_field()  # any string you choose, typed again in the app's webhook settings
    api_base_url: HttpUrl = "https://graph.facebook.com/v21.0"
    # an approved message template sent instead of a reply outside the 24-hour window (unset: the
    # reply fails with that reason, plainly); its one body parameter is the start of the reply
    template_name: OptionalText = None
    template_language: str = "en"

    @model_validator(mode="after")
    def _half_configured(self) -> WhatsAppConfig:
        if not self.enabled or not self.access_token:
            return self
        for key, how in (("phone_number_id", "the business number's id from WhatsApp Manager > API setup"),
                         ("app_secret", "the app secret from App settings > Basic: every webhook is checked "
                                        "against it, and nothing unsigned is accepted"),
                         ("verify_token", "any long random string (openssl rand -hex 32), entered again as "
                                          "the webhook's Verify token in the app dashboard")):
            if not getattr(self, key):
                raise KeyedError(key, f"is not set but access_token is; set {how}")
        return self

    def credential_problem(self) -> str | None:
        return None if self.access_token else "platforms.whatsapp.access_token is not set"

    async def probe(self, timeout: float) -> tuple[bool, str, str]:
        """``switchboard doctor``: the phone number's own record, read with the access token."""
        import aiohttp

        url = f"{self.api_base_url.rstrip('/')}/{self.phone_number_id}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                async with http.get(url, params={"fields": "display_phone_number"},
                                    headers={"Authorization": f"Bearer {self.access_token}"}) as r:
                    body = await r.json(content_type=None)
                    status = r.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"cannot reach the Graph API: {type(exc).__name__}", "check platforms.whatsapp.api_base_url and the network"
        number = body.get("display_phone_number") if isinstance(body, dict) else None
        if status == 200 and number:
            return True, f"token valid ({number})", ""
        return (False, f"the token was refused (HTTP {status})",
                "set platforms.whatsapp.access_token to a system user's token, and phone_number_id to the number's id")
