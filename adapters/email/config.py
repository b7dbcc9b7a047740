"""``platforms.email``: the IMAP mailbox the agent reads, the SMTP server it answers through, who may write.

Published to the gateway under the ``switchboard.adapter_configs`` entry point;
``config.example.yaml`` documents every key.
"""

from __future__ import annotations

import importlib.util
from email.headerregistry import Address
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gateway.config import KeyedError, OptionalText, PlatformConfig, describe, secret_field
from gateway.types import Capabilities, SetupGuide, SetupValue

__all__ = ["EmailConfig", "strict_address"]

Tls = Literal["ssl", "starttls", "none"]
# what the adapter imports (the switchboard[email] extra); without them the platform stays off, saying so
_LIBRARIES = ("aioimaplib", "aiosmtplib", "mailparser_reply", "html2text")


def strict_address(value: str) -> str | None:
    """``value`` as one bare address (``local@domain``, lower-cased), or None when it is anything else
    (a display name, angle brackets, a list, spaces, no ``@``)."""
    text = value.strip()
    if not text or any(c.isspace() or c in '<>",;()[]\\' for c in text) or text.count("@") != 1:
        return None
    local, domain = text.split("@")
    if not local or not domain or "." not in domain.strip(".") or domain.startswith(".") or domain.endswith("."):
        return None
    try:
        Address(addr_spec=text)
    except (ValueError, IndexError):
        return None
    return text.lower()


class EmailConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "email"
    LIBRARY: ClassVar[str | None] = "aioimaplib"  # the switchboard[email] extra
    # A sent mail cannot be changed (replies go whole); every thread is a private conversation with one
    # sender (no groups, no shared threads); attachments are read; a reply over 100,000 characters goes
    # as several mails.  SMTP sets no pace per recipient: a burst of parts goes at once.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=False, threads=False, buttons=False, typing=False, reactions=False, files=True, voice=False,
        groups=False, max_message_length=100_000, chat_rate=5.0, chat_burst=10)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Email",
        ("A mailbox of its own for the gateway (mail in it is answered): its IMAP server, and the SMTP server "
         "that sends as it (docs/configuration.md, platforms.email).",
         "Ports and TLS take their defaults (993 with TLS, 587 with STARTTLS); change them in the config after."),
        (SetupValue("imap_host", "EMAIL_IMAP_HOST", "IMAP server (imap.example.com)", secret=False),
         SetupValue("smtp_host", "EMAIL_SMTP_HOST", "SMTP server (smtp.example.com)", secret=False),
         SetupValue("username", "EMAIL_USERNAME", "The mailbox's login (often its address)", secret=False),
         SetupValue("password", "EMAIL_PASSWORD", "Its password (an app password where the provider has them)")),
        "check the servers, the login and the password (many providers want an app password for IMAP)")
    imap_host: str = ""
    imap_port: int = Field(993, ge=1, le=65535)
    imap_tls: Literal["ssl", "none"] = "ssl"  # implicit TLS (993); "none" for a server on this host
    username: str = ""  # the IMAP login (and SMTP's, unless smtp_username is set)
    password: str = secret_field()
    mailbox: str = "INBOX"
    smtp_host: str = ""
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_tls: Tls = "starttls"
    smtp_username: OptionalText = None  # unset: username
    smtp_password: str = secret_field()  # unset: password
    address: OptionalText = None  # the From of replies; unset: username when it is an address
    from_name: str = "Switchboard"
    idle: bool = True  # IMAP IDLE when the server offers it; polling every poll_seconds otherwise
    poll_seconds: float = Field(30.0, gt=0)
    idle_seconds: float = Field(300.0, gt=0, le=1740)  # IDLE is renewed this often (RFC 2177: under 29 min)
    taken_keyword: str = "$SwitchboardTaken"  # the IMAP keyword set on every message once it is stored
    # Only mail the operator's own server vouched for: an Authentication-Results header from
    # authserv_id saying DKIM (aligned with the From domain) or SPF (the From domain) passed.
    authserv_id: OptionalText = None
    max_body_chars: int = Field(50_000, ge=100)  # a longer body is cut, and the model is told so

    @field_validator("allowed_users", mode="after")
    @classmethod
    def _bare_user_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:  # replaces the base model's check
        out = []
        for i, item in enumerate(value):
            platform, sep, rest = item.strip().partition(":")
            if sep and platform.lower() == "email":  # "email:boss@example.com", as auth.allowed_users writes it
                item = rest
            address = strict_address(item)
            if address is None:
                raise KeyedError(str(i), "must be one bare address like boss@example.com, without a display name "
                                         f"or angle brackets (got {describe(item)})")
            out.append(address)
        return tuple(out)

    @field_validator("taken_keyword")
    @classmethod
    def _atom(cls, value: str) -> str:
        if not value or any(c.isspace() or c in '(){%*"\\]' for c in value) or value.startswith("\\"):
            raise ValueError(f"must be an IMAP keyword (an atom like $SwitchboardTaken) (got {describe(value)})")
        return value

    @field_validator("address")
    @classmethod
    def _from_address(cls, value: str | None) -> str | None:
        if value is not None and strict_address(value) is None:
            raise ValueError(f"must be one bare address like bot@example.com (got {describe(value)})")
        return value.strip().lower() if value else None

    @model_validator(mode="after")
    def _half_configured(self) -> EmailConfig:
        if not self.enabled or not self.imap_host:
            return self
        for key in ("username", "smtp_host"):
            if not getattr(self, key):
                raise KeyedError(key, "is not set but imap_host is; the email platform needs the mailbox's login "
                                      "(username, password) and the SMTP server it answers through (smtp_host)")
        if self.from_address is None:
            raise KeyedError("address", f"is not set and username {describe(self.username)} is not an address; set "
                                        "the address replies come from (bot@example.com)")
        return self

    @property
    def from_address(self) -> str | None:
        return self.address or strict_address(self.username)

    def credential_problem(self) -> str | None:
        if not self.imap_host:
            return "platforms.email.imap_host is not set"
        if not self.password:
            return "platforms.email.password is not set"
        missing = [name for name in _LIBRARIES if importlib.util.find_spec(name) is None]
        if missing:
            return (f"platforms.email needs the email extra ({', '.join(missing)} not installed): "
                    "pip install 'switchboard[email]'")
        return None

    async def probe(self, timeout: float) -> tuple[bool, str, str]:
        """``switchboard doctor``: log in to the IMAP mailbox and to the SMTP server (nothing is sent)."""
        from .outbound import probe_servers  # the extra's libraries, imported only when asked

        return await probe_servers(self, timeout)

    def connection_identity(self) -> str:
        """What names the one IMAP connection a cluster runs at a time (hashed into its key, never stored)."""
        return f"{self.imap_host.lower()}:{self.imap_port}:{self.username}:{self.mailbox}"
