"""The gateway's errors.

    SwitchboardError                 root of everything the gateway raises on purpose
    ├── ConfigError                  the config file is wrong; carries file, key path, fix (exit 78)
    ├── AdapterError                 a platform adapter could not start or deliver
    │   ├── PlatformHTTPError        the platform answered with an error status
    │   └── RateLimited              the platform said "wait retry_after seconds" (not a failure)
    ├── ModelUnavailable             the model endpoint failed after every retry
    └── AlreadyRunning               another daemon holds this home's lock

``state.StateError`` is the store's own root (``state`` imports nothing from
the gateway); the CLI turns both into one line and an exit code.
"""

from __future__ import annotations


class SwitchboardError(Exception):
    """Something the gateway refuses or cannot do, said so the operator can act."""


class ConfigError(SwitchboardError):
    """The config file is invalid."""

    exit_code = 78  # EX_CONFIG: systemd's RestartPreventExitStatus keeps a broken config from looping

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        where = ": ".join(p for p in (file, key) if p)
        super().__init__(f"{where}: {message}" if where else message)


class AdapterError(SwitchboardError):
    """A platform adapter failed."""


class PlatformHTTPError(AdapterError):
    """The platform answered with an error."""

    def __init__(self, platform: str, status: int, description: str):
        self.platform = platform
        self.status = status
        self.description = description
        super().__init__(f"{platform} answered {status}: {description}")


class RateLimited(AdapterError):
    """The platform asked us to wait before sending again."""

    def __init__(self, platform: str, retry_after: float):
        self.platform = platform
        self.retry_after = retry_after
        super().__init__(f"{platform} rate limit: retry after {retry_after:.1f}s")


class ModelUnavailable(SwitchboardError):
    """The model endpoint failed after every retry."""


class AlreadyRunning(SwitchboardError):
    """Another daemon is already running on this home."""
