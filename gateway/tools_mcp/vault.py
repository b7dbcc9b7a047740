"""The key that seals the MCP servers' OAuth secrets at rest, and the sealing.

    vault = Vault.open(home)                # reads <home>/mcp-oauth.key, or makes it (mode 0600)
    sealed = vault.seal({"access_token": ...})   # text for the store (db.mcp_auth)
    vault.unseal(sealed)                    # the dict again; VaultError when the key does not fit

Fernet (``cryptography``): AES-128-CBC with an HMAC-SHA256 over it, so a row altered in the store,
or sealed under another key, is refused rather than read.  The key lives beside the store in the
home, not in it: a copy of ``state.db`` (a backup, an export, a PostgreSQL dump) holds no token
anyone can use.  Every instance of a cluster needs the same key file (copy it with the config).
Losing the key loses only the sign-ins: people are sent a new link.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from gateway.errors import SwitchboardError

KEY_FILE = "mcp-oauth.key"


class VaultError(SwitchboardError):
    """A sealed secret could not be opened (another key, or an altered row); the sign-in is asked again."""


@dataclass(frozen=True)
class Vault:
    path: Path
    _fernet: Fernet

    def __repr__(self) -> str:  # never the key
        return f"Vault({str(self.path)!r})"

    @classmethod
    def open(cls, home: Path) -> Vault:
        """The home's key (made on first use, readable by its owner alone).  Blocking: call off the loop."""
        path = Path(home) / KEY_FILE
        try:
            key = path.read_bytes().strip()
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            key = Fernet.generate_key()
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another process made it meanwhile: theirs is the key
                key = path.read_bytes().strip()
            else:
                with os.fdopen(fd, "wb") as out:
                    out.write(key + b"\n")
                    out.flush()
                    os.fsync(out.fileno())
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            os.chmod(path, 0o600)  # a key left readable by others is closed again
        try:
            return cls(path, Fernet(key))
        except ValueError as exc:
            raise VaultError(f"{path} does not hold a key (32 url-safe base64 bytes); move it away and a new one "
                             "is made (everyone signs in again)") from exc

    def seal(self, value: dict) -> str:
        return self._fernet.encrypt(json.dumps(value, separators=(",", ":")).encode()).decode("ascii")

    def unseal(self, sealed: str) -> dict:
        try:
            return json.loads(self._fernet.decrypt(sealed.encode("ascii")))
        except (InvalidToken, ValueError) as exc:
            raise VaultError(f"a sealed MCP sign-in could not be opened with {self.path}") from exc
