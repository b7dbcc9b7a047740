"""``platforms.signal``: the account signal-cli runs for and where its HTTP daemon answers.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import field_validator

from gateway.config import HttpUrl, PlatformConfig, describe
from gateway.types import Capabilities, SetupGuide, SetupValue

__all__ = ["SignalConfig"]


class SignalConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "signal"
    # about 2,000 characters show as one message (longer ones Signal turns into a file); groups, no
    # threads, no buttons (approvals by a 👍 on the request, or /approve), typing, reactions, files
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=False, threads=False, buttons=False, typing=True, reactions=True, files=True, voice=False,
        groups=True, max_message_length=2000, chat_rate=1.0, chat_burst=3)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Signal",
        ("Run signal-cli registered or linked as the bot's number: signal-cli -a +NUMBER daemon --http "
         "127.0.0.1:8080 (docs/platforms.md, Signal).",
         "Keep it on loopback: signal-cli's HTTP interface has no authentication of its own."),
        (SetupValue("account", "SIGNAL_ACCOUNT", "The bot's number (+4915112345678)", secret=False),
         SetupValue("http_url", "SIGNAL_HTTP_URL", "Where signal-cli answers", secret=False,
                    default="http://127.0.0.1:8080")),
        "start signal-cli's daemon for that number (docs/platforms.md, Signal)")
    account: str = ""  # the number signal-cli is registered or linked as, +E.164
    http_url: HttpUrl = "http://127.0.0.1:8080"  # signal-cli daemon --http 127.0.0.1:8080

    @field_validator("account")
    @classmethod
    def _e164(cls, value: str) -> str:
        value = value.strip()
        if value and not re.fullmatch(r"\+[1-9]\d{6,14}", value):
            raise ValueError(f"must be the account's number in international form, like +4915112345678 "
                             f"(got {describe(value)})")
        return value

    def credential_problem(self) -> str | None:
        return None if self.account else "platforms.signal.account is not set"

    def connection_identity(self) -> str:
        """One event stream per account: one instance of a cluster reads it, like Telegram's poller."""
        return self.account

    async def probe(self, timeout: float) -> tuple[bool, str, str]:
        """``switchboard doctor``: the daemon answers (GET /api/v1/check) and the account is its own."""
        import aiohttp

        base = self.http_url.rstrip("/")
        how = f"start it: signal-cli -a {self.account} daemon --http 127.0.0.1:8080 (docs/platforms.md, Signal)"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
                async with http.get(f"{base}/api/v1/check") as r:
                    if r.status != 200:
                        return False, f"signal-cli answered HTTP {r.status} at {base}", how
                async with http.post(f"{base}/api/v1/rpc",
                                     json={"jsonrpc": "2.0", "id": 1, "method": "listAccounts"}) as r:
                    body = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"signal-cli does not answer at {base}: {type(exc).__name__}", how
        result = body.get("result") if isinstance(body, dict) else None
        numbers = [a.get("number") for a in result if isinstance(a, dict)] if isinstance(result, list) else []
        if self.account in numbers:
            return True, f"signal-cli answers; {self.account} is registered", ""
        return (False, f"{self.account} is not an account of this signal-cli (it has {', '.join(map(str, numbers)) or 'none'})",
                "register or link it (docs/platforms.md, Signal), or fix platforms.signal.account")
