"""``platforms.matrix``: the homeserver, the bot's account, and how it logs in.

Published to the gateway under the ``switchboard.adapter_configs`` entry point (loaded without
matrix-nio); ``config.example.yaml`` documents every key.
"""

from __future__ import annotations

import hashlib
import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gateway.config import HttpUrl, KeyedError, PlatformConfig, secret_field
from gateway.types import Capabilities, CredentialCheck, SetupGuide, SetupValue

__all__ = ["MatrixConfig"]

_USER_ID = re.compile(r"^@[^:\s]+:[^\s]+$")


def verified_device(entry: str) -> tuple[str, str, str] | None:
    """``"@ann:example.org DEVICEID <key>"`` -> (user id, device id, the ed25519 key without its spaces)."""
    parts = entry.split()
    if len(parts) < 3 or not _USER_ID.match(parts[0]):
        return None
    return parts[0], parts[1], "".join(parts[2:])


class MatrixConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "matrix"
    LIBRARY: ClassVar[str | None] = "nio"  # matrix-nio, the switchboard[matrix] extra
    # An event is at most 65,536 bytes of JSON (the spec's limit); a reply part of 4,000 characters
    # with its HTML stays well within it (the adapter checks every event's size and halves a part
    # that would not).  Edits are m.replace, threads m.thread, reactions stand in for buttons
    # (approvals: a reaction of the asker's or an approver's, or /approve typed).  Matrix has no
    # per-room limit; Synapse's is per user (rc_message, 0.2 a second with bursts of 10 by default,
    # which an admin lifts for a bot: docs/platforms.md), and its 429s are waited out.  The adapter
    # keeps one room to 2 events a second with bursts of 4, so a streamed reply never floods it.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities(
        edits=True, threads=True, buttons=True, typing=True, reactions=True, files=True, voice=True,
        max_message_length=4000, chat_rate=2.0, chat_burst=4)
    SETUP: ClassVar[SetupGuide | None] = SetupGuide(
        "Matrix",
        ("Register the bot's own account on your homeserver; sign in as it in a private browser window (Element: "
         "Settings -> Help & About -> Access Token), copy the token and close the window (signing out revokes it).",
         "Or let the adapter log in once with a password: platforms.matrix.user_id and password in the config."),
        (SetupValue("homeserver", "MATRIX_HOMESERVER", "Homeserver address", secret=False,
                    default="https://matrix.org"),
         SetupValue("access_token", "MATRIX_ACCESS_TOKEN", "The bot's access token")),
        "copy the access token again (Element: Settings -> Help & About -> Access Token) and check the homeserver")
    homeserver: HttpUrl = "https://matrix.org"
    user_id: str = ""  # @bot:example.org
    access_token: str = secret_field()  # or a password, used once: the token and device id are kept in the home
    password: str = secret_field()
    device_name: str = "Switchboard"
    sync_timeout_seconds: float = Field(30.0, gt=0, le=120)  # the long poll of /sync
    max_media_bytes: int = Field(20 * 1024 * 1024, ge=1)  # larger files are described, not downloaded
    # End-to-end encrypted rooms read and answered (the device's keys in <home>/platforms/matrix/); false:
    # such a room is told once that it is not read.  Not with a cluster (cluster_problem says why).
    encryption: bool = True
    # Who gets the keys to the bot's encrypted replies: "tofu" every device of the room's members, its keys
    # pinned the first time the bot sees them; "verified" only the devices in verified_devices.
    device_trust: Literal["tofu", "verified"] = "tofu"
    # "@ann:example.org DEVICEID <its session key>" (Element: Settings -> Sessions), for device_trust: verified.
    verified_devices: tuple[str, ...] = ()

    @field_validator("user_id")
    @classmethod
    def _full_user_id(cls, value: str) -> str:
        value = value.strip()
        if value and not _USER_ID.match(value):
            raise ValueError(f'must be a full Matrix user id like "@bot:example.org" (got {value!r})')
        return value

    @field_validator("allowed_users", mode="after")
    @classmethod
    def _bare_user_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # a Matrix id has a colon of its own (@ann:example.org): only a leading "matrix:" is a prefix
        out = []
        for i, item in enumerate(value):
            user_id = item.strip().removeprefix("matrix:")
            if not _USER_ID.match(user_id):
                raise KeyedError(str(i), f'must be a full Matrix user id like "@ann:example.org" (got {item!r})')
            out.append(user_id)
        return tuple(out)

    @field_validator("verified_devices", mode="after")
    @classmethod
    def _devices(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, item in enumerate(value):
            if verified_device(item) is None:
                raise KeyedError(str(i), 'must be "@ann:example.org DEVICEID <its session key>" (the key as '
                                 f"Element shows it under Settings -> Sessions; got {item!r})")
        return value

    @model_validator(mode="after")
    def _needs_a_user_for_a_password(self) -> MatrixConfig:
        if self.enabled and self.password and not self.user_id:
            raise KeyedError("user_id", "is not set but password is: a password login needs the bot's user id "
                             "(@bot:example.org)")
        if self.enabled and self.encryption and self.device_trust == "verified" and not self.verified_devices:
            raise KeyedError("verified_devices", "is empty but device_trust is verified: no device could read the "
                             "bot's encrypted replies; list them, or set device_trust: tofu")
        return self

    def cluster_problem(self) -> tuple[str, str] | None:
        """E2EE and a cluster: the device's Olm and Megolm sessions live in one crypto store in the home of
        the instance that syncs, and a standby (or the next owner) could neither decrypt nor encrypt with
        them, so the two are refused together, saying what to do."""
        if not (self.enabled and self.encryption):
            return None
        return ("encryption", "is true, and a cluster cannot share the device's crypto store (it lives in the "
                "home of the instance that syncs): set platforms.matrix.encryption: false (encrypted rooms are then "
                "told once that they are not read), or run the Matrix bot on a single instance (SQLite store)")

    def credential_problem(self) -> str | None:
        if self.access_token or self.password:
            return None
        return "platforms.matrix.access_token is not set (or a password with user_id)"

    def credential_check(self) -> CredentialCheck | None:
        """``switchboard doctor`` asks the homeserver who the token is (``whoami``, as the adapter's start
        does).  With a password there is nothing to ask: a login would make a new device each time, so the
        adapter's start checks it."""
        if not self.access_token:
            return None
        return CredentialCheck("GET", f"{str(self.homeserver).rstrip('/')}/_matrix/client/v3/account/whoami",
                               {"Authorization": f"Bearer {self.access_token}"},
                               lambda status, body: status == 200 and body.get("user_id"))

    def connection_identity(self) -> str | None:
        """The one /sync of this account a cluster runs at a time (gateway.runtime.cluster hashes it into the
        key): the homeserver and the user, or the token's fingerprint when the user is asked of the server."""
        who = self.user_id or hashlib.sha256((self.access_token or self.password).encode()).hexdigest()[:16]
        return f"{self.homeserver}|{who}"
