"""``platforms.teams``: the Azure bot's app id and secret, Microsoft's login URLs.

The messaging endpoint is ``/teams/messages`` on the daemon's local API (``HTTP_PATHS``; ``api.host``
and ``api.port`` say where it listens): the Azure bot's messaging endpoint is the public HTTPS
address a reverse proxy forwards to it.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.  The three Microsoft addresses (the OpenID metadata that
names the keys activities are signed with, and the token endpoint that hands out the bot's own
token) are settings so that tests can point them at a local fake.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from gateway.config import HttpUrl, KeyedError, PlatformConfig, secret_field
from gateway.types import Capabilities, SetupGuide, SetupValue

__all__ = ["MESSAGES_PATH", "TeamsConfig"]

MESSAGES_PATH = "/teams/messages"

BOT_FRAMEWORK_METADATA = "https://login.botframework.com/v1/.well-known/openidconfiguration"
BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"


class TeamsConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "teams"
    # Teams takes about 28 KB a message; we send 4,000 characters a part, which reads well.  Bots may
    # send about 7 messages a second into one conversation (Microsoft's documented per-thread limit);
    # we keep to 2 a second, bursts of 3.  Channel threads are threads; Adaptive Cards carry buttons;
    # typing activities; files arrive as attachments with a download URL.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=True, reactions=False, files=True, voice=False,
        max_message_length=4000, chat_rate=2.0, chat_burst=3)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Microsoft Teams",
        ("portal.azure.com -> Create a resource -> Azure Bot: its Microsoft App ID; Configuration -> Manage "
         "Password -> New client secret.",
         "Messaging endpoint: https://<your host>/teams/messages (a TLS proxy to the local API); Channels: add "
         "Microsoft Teams."),
        (SetupValue("app_id", "TEAMS_APP_ID", "Microsoft App ID", secret=False),
         SetupValue("app_password", "TEAMS_APP_PASSWORD", "Client secret")),
        "check the App ID and make a new client secret (Azure Bot -> Configuration -> Manage Password)")
    LIBRARY: ClassVar[str | None] = "jwt"  # PyJWT with its RSA support, the switchboard[teams] extra
    # the messaging endpoint, on the local API's listener (gateway.runtime.platform_http mounts it)
    HTTP_PATHS: ClassVar[tuple[str, ...]] = (MESSAGES_PATH,)
    app_id: str = ""  # the Azure bot's Microsoft App ID (a GUID): the audience of every inbound token
    app_password: str = secret_field()  # its client secret
    tenant_id: str = "botframework.com"  # single-tenant bots: the Entra tenant id
    openid_metadata_url: HttpUrl = BOT_FRAMEWORK_METADATA
    issuer: str = BOT_FRAMEWORK_ISSUER
    # {tenant} is replaced by tenant_id
    token_url: HttpUrl = "https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token"
    token_scope: str = "https://api.botframework.com/.default"
    # how often the signing keys are read again (Microsoft rotates them; an unknown key id reads them at once)
    keys_refresh_seconds: float = Field(24 * 3600.0, gt=0)
    # where replies go for a conversation this instance has received nothing from (Microsoft's global
    # connector; each activity's own serviceUrl is used once seen)
    service_url: HttpUrl = "https://smba.trafficmanager.net/teams/"
    # the serviceUrl an activity names must be one of these hosts' (empty: any https URL, and http on loopback)
    service_url_hosts: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _half_configured(self) -> TeamsConfig:
        if self.enabled and self.app_password and not self.app_id:
            raise KeyedError("app_id", "is not set but app_password is; set TEAMS_APP_ID (the bot's Microsoft App ID)")
        if self.enabled and self.app_id and not self.app_password:
            raise KeyedError("app_password", "is not set but app_id is; set TEAMS_APP_PASSWORD (a client secret "
                             "from the app registration's Certificates & secrets)")
        return self

    async def probe(self, timeout: float) -> tuple[bool, str, str] | None:
        """``switchboard doctor``: ask the token endpoint for the bot's token with these credentials."""
        import aiohttp

        form = {"grant_type": "client_credentials", "client_id": self.app_id, "client_secret": self.app_password,
                "scope": self.token_scope}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.post(self.token_url.replace("{tenant}", self.tenant_id), data=form) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        body = body if isinstance(body, dict) else {}
        if status == 200 and body.get("access_token"):
            return True, f"app secret valid (app {self.app_id})", ""
        error = body.get("error") or f"HTTP {status}"
        return (False, f"the app secret was refused ({error})",
                "put a current client secret of the app in platforms.teams.app_password")

    def credential_problem(self) -> str | None:
        return None if self.app_id and self.app_password else "platforms.teams.app_id is not set"
