"""The gateway's configuration: one YAML file, validated once into frozen objects.

    cfg = load_config()                  # --config path, else $SWITCHBOARD_CONFIG, else $SWITCHBOARD_HOME/config.yaml
    cfg.platforms.telegram.token         # "" when not set
    cfg.enabled_platforms()              # {"telegram": "on", "discord": "off: platforms.discord.token is not set", ...}
    cfg.sessions.reset_policy_for("telegram", "group")

Every model is frozen and forbids unknown keys, so a misspelt key fails at
start-up naming the key and the valid ones nearby.  Lists are tuples and the
``identities`` mapping is read-only.  Every problem becomes one
:class:`gateway.errors.ConfigError` (exit code 78) whose message reads
``config.yaml: sessions.reset.mode: must be one of idle, daily, both, none (got "sometimes")``.

String values may use ``${VAR}`` (must be set) and ``${VAR:-default}`` (default
when unset or empty); ``$${`` is a literal ``${``.  Relative paths (``home``,
``model.persona_file``) are read from the config file's directory.

Secrets (tokens, API keys, the Slack signing secret, the webhook secret, the
API token) are plain ``str`` fields, hidden from ``repr`` and replaced by
``"***"`` in :meth:`Config.redacted`; :meth:`Config.secrets` hands their
values to the log redactor.
"""

from __future__ import annotations

import ipaddress
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway import _config_load
from gateway._config_load import KeyedError
from gateway.durations import parse_duration

__all__ = [
    "PLATFORMS",
    "ApiConfig",
    "AuthConfig",
    "CompressionConfig",
    "Config",
    "CronConfig",
    "CronJobConfig",
    "DiscordConfig",
    "LoggingConfig",
    "ModelConfig",
    "PlatformsConfig",
    "RecallConfig",
    "ResetConfig",
    "ResetOverride",
    "ResetPolicy",
    "SessionsConfig",
    "ShutdownConfig",
    "SlackConfig",
    "StoreConfig",
    "TelegramConfig",
    "config_from_dict",
    "find_config_path",
    "load_config",
]

PLATFORMS: tuple[str, ...] = ("telegram", "discord", "slack")
CHAT_TYPES: tuple[str, ...] = ("dm", "group", "thread", "channel")
REDACTED = "***"

ResetMode = Literal["idle", "daily", "both", "none"]


class _Model(BaseModel):
    # coerce_numbers_to_str: YAML reads `- 123456` (a Telegram user id) as an int.
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    @model_validator(mode="before")
    @classmethod
    def _blank_means_default(cls, data: Any) -> Any:
        # `sessions:` with every line under it commented out, or `allowed_users:`
        # with nothing after it, is YAML null: take the default rather than fail.
        if isinstance(data, dict):
            blank = [
                k for k, v in data.items()
                if v is None and k in cls.model_fields and not cls.model_fields[k].is_required()
                and not _accepts_none(cls.model_fields[k].annotation)
            ]
            if blank:
                data = {k: v for k, v in data.items() if k not in blank}
        return data


def _accepts_none(annotation: Any) -> bool:
    return annotation is Any or type(None) in typing.get_args(annotation)


def _secret(**kwargs: Any) -> Any:
    """A secret string field: empty when unset, hidden from repr, redacted by Config.redacted()."""
    return Field("", repr=False, json_schema_extra={"secret": True}, **kwargs)


def _empty_to_none(value: Any) -> Any:
    # `${TELEGRAM_WEBHOOK_URL:-}` expands to "": that means "not set".
    return None if isinstance(value, str) and value.strip() == "" else value


def _check_url(schemes: tuple[str, ...]):
    def check(value: str | None) -> str | None:
        if value is None:
            return value
        scheme, sep, rest = value.partition("://")
        if not sep or scheme.lower() not in schemes or not rest or rest.startswith("/"):
            starts = " or ".join(f"{scheme}://" for scheme in schemes)
            raise ValueError(f"must be a URL starting with {starts} (got {_config_load.describe(value)})")
        return value

    return check


HttpUrl = Annotated[str, AfterValidator(_check_url(("http", "https")))]
OptionalHttpUrl = Annotated[HttpUrl | None, BeforeValidator(_empty_to_none)]
OptionalText = Annotated[str | None, BeforeValidator(_empty_to_none)]
Seconds = Annotated[float, Field(gt=0)]


def _check_user_ref(value: str) -> str:
    platform, sep, user_id = value.partition(":")
    platform = platform.strip().lower()
    user_id = user_id.strip()
    if not sep or platform not in PLATFORMS or not user_id or any(c.isspace() for c in user_id):
        raise ValueError(
            f"must be platform:user_id with platform one of {', '.join(PLATFORMS)}, "
            f'like "telegram:123456789" or "slack:U0123ABCD" (got {_config_load.describe(value)})'
        )
    return f"{platform}:{user_id}"


UserRef = Annotated[str, AfterValidator(_check_user_ref)]


def _resolve_path(value: Path | None, info: ValidationInfo) -> Path | None:
    if value is None:
        return None
    value = value.expanduser()
    if not value.is_absolute():
        base = (info.context or {}).get("base_dir") or Path.cwd()
        value = Path(base) / value
    return value


# --------------------------------------------------------------------------- model


class ModelConfig(_Model):
    """The OpenAI-compatible endpoint the agent talks to."""

    base_url: HttpUrl = "http://127.0.0.1:8000/v1"
    api_key: str = _secret()
    name: str = Field("default", min_length=1)
    context_length: Annotated[int | None, BeforeValidator(_empty_to_none)] = Field(None, ge=512)  # None: known-model table, else a default
    timeout_seconds: Seconds = 120.0
    max_concurrent_calls: int = Field(4, ge=1, le=256)
    vision: bool = False
    max_retries: int = Field(3, ge=0, le=20)
    retry_total_seconds: Seconds = 90.0
    persona: OptionalText = None
    persona_file: Annotated[Path | None, BeforeValidator(_empty_to_none)] = None
    max_tool_iterations: int = Field(8, ge=1, le=100)
    # a message estimated above this share of the context window is stored whole but sent cut down
    max_message_share: float = Field(0.5, ge=0.05, le=1)
    # Whether the model's reasoning (reasoning, reasoning_content, reasoning_details, encrypted reasoning
    # items) is sent back to it: within a tool loop, also in later turns, or never.
    replay_reasoning: Literal["tool_loop", "always", "never"] = "tool_loop"

    @field_validator("persona_file")
    @classmethod
    def _persona_file_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        value = _resolve_path(value, info)
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value} (a relative path is read from the config file's directory)")
        return value

    @model_validator(mode="after")
    def _one_persona(self) -> ModelConfig:
        if self.persona is not None and self.persona_file is not None:
            raise KeyedError("persona_file", "set either model.persona (inline text) or model.persona_file, not both")
        return self

    def persona_text(self) -> str | None:
        """The persona: inline text, or the file's contents (read now; call at start-up)."""
        if self.persona_file is not None:
            return self.persona_file.read_text(encoding="utf-8")
        return self.persona


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True, slots=True)
class ResetPolicy:
    """When a session starts afresh: after ``idle_minutes`` without messages,
    daily at ``at_hour`` (in the config's timezone), both (whichever comes first), or never."""

    mode: str = "both"  # idle | daily | both | none
    idle_minutes: int = 1440
    at_hour: int = 4

    @property
    def resets_when_idle(self) -> bool:
        return self.mode in ("idle", "both")

    @property
    def resets_daily(self) -> bool:
        return self.mode in ("daily", "both")


class ResetOverride(_Model):
    """A partial reset policy: the fields set here replace the ones above it."""

    mode: ResetMode | None = None
    idle_minutes: int | None = Field(None, ge=1)
    at_hour: int | None = Field(None, ge=0, le=23)


class ResetByPlatform(_Model):
    telegram: ResetOverride | None = None
    discord: ResetOverride | None = None
    slack: ResetOverride | None = None


class ResetByType(_Model):
    dm: ResetOverride | None = None
    group: ResetOverride | None = None
    thread: ResetOverride | None = None
    channel: ResetOverride | None = None


class ResetConfig(_Model):
    mode: ResetMode = "both"
    idle_minutes: int = Field(1440, ge=1)
    at_hour: int = Field(4, ge=0, le=23)
    by_platform: ResetByPlatform = ResetByPlatform()
    by_type: ResetByType = ResetByType()


def _duration_seconds(value: Any) -> Any:
    """``1h``, ``30m``, ``2d`` (as cron's schedules take them) or a number of seconds."""
    if isinstance(value, str):
        return parse_duration(value.strip())
    return value


class SessionsConfig(_Model):
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False
    reset: ResetConfig = ResetConfig()
    # After a restart, unanswered messages newer than this are answered; older ones get one line
    # saying so instead (an answer to an hour-old question is rarely what the user wants).
    resume_within: Annotated[float, BeforeValidator(_duration_seconds), Field(gt=0)] = 3600.0

    def reset_policy_for(self, platform: str, chat_type: str) -> ResetPolicy:
        """The effective reset policy for one chat.

        Precedence, field by field (``mode``, ``idle_minutes``, ``at_hour``):
        ``sessions.reset.by_type.<chat_type>`` over
        ``sessions.reset.by_platform.<platform>`` over the global
        ``sessions.reset`` values.  An unknown platform or chat type just
        gets no override.  ``chat_type`` may be a :class:`gateway.types.ChatType`.
        """
        chat_type = str(getattr(chat_type, "value", chat_type))
        r = self.reset
        fields: dict[str, Any] = {"mode": r.mode, "idle_minutes": r.idle_minutes, "at_hour": r.at_hour}
        by_platform = getattr(r.by_platform, platform) if platform in PLATFORMS else None
        by_type = getattr(r.by_type, chat_type) if chat_type in CHAT_TYPES else None
        for override in (by_platform, by_type):  # later wins
            if override is not None:
                fields.update({k: v for k, v in override.model_dump().items() if v is not None})
        return ResetPolicy(**fields)


# --------------------------------------------------------------------------- auth


IdentityMap = Annotated[
    Mapping[str, tuple[UserRef, ...]],
    AfterValidator(lambda m: MappingProxyType(dict(m))),
    PlainSerializer(dict),
]


class AuthConfig(_Model):
    allow_all: bool = False
    allowed_users: tuple[UserRef, ...] = ()
    unauthorized_dm: Literal["pair", "ignore"] = "pair"
    owner: OptionalText = None


# --------------------------------------------------------------------------- platforms


class _PlatformConfig(_Model):
    """What every platform has besides its credentials."""

    PLATFORM: ClassVar[str] = ""
    enabled: bool = True
    allowed_users: tuple[str, ...] = ()
    require_mention: bool = True
    free_response_channels: tuple[str, ...] = ()
    stall_timeout_seconds: Seconds = 120.0

    @field_validator("allowed_users", mode="after")
    @classmethod
    def _bare_user_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Accept "123" or "telegram:123" here; keep the bare id.
        out = []
        for i, item in enumerate(value):
            platform, sep, user_id = item.strip().rpartition(":")
            if sep and platform.lower() != cls.PLATFORM:
                raise KeyedError(str(i), f'must be a {cls.PLATFORM} user id, like "123456789" or "{cls.PLATFORM}:123456789" (got {_config_load.describe(item)})')
            if not user_id or any(c.isspace() for c in user_id):
                raise KeyedError(str(i), f"must be a {cls.PLATFORM} user id without spaces (got {_config_load.describe(item)})")
            out.append(user_id)
        return tuple(out)

    def credential_problem(self) -> str | None:
        """Why the platform is off ("platforms.x.key is not set"), or None when it can start."""
        raise NotImplementedError


class TelegramConfig(_PlatformConfig):
    PLATFORM: ClassVar[str] = "telegram"
    token: str = _secret()
    base_url: HttpUrl = "https://api.telegram.org/bot"  # python-telegram-bot appends the token
    base_file_url: OptionalHttpUrl = None  # None: derived from base_url (.../bot -> .../file/bot)
    poll_timeout: int = Field(30, ge=0, le=120)  # long-polling getUpdates timeout, seconds
    max_image_bytes: int = Field(5 * 1024 * 1024, ge=1)  # larger photos are not downloaded for vision
    webhook_url: OptionalHttpUrl = None  # unset: long polling
    webhook_listen: str = "127.0.0.1"
    webhook_port: int = Field(8443, ge=0, le=65535)
    webhook_secret: str = _secret()

    @field_validator("webhook_secret")
    @classmethod
    def _telegram_secret_charset(cls, value: str) -> str:
        # Telegram's rule for secret_token; the value itself is never echoed.
        if value and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", value):
            raise ValueError("must be 1-256 characters from A-Z a-z 0-9 _ - (Telegram's rule); generate one with: openssl rand -hex 32")
        return value

    @model_validator(mode="after")
    def _half_configured(self) -> TelegramConfig:
        if self.enabled and not self.token and (self.webhook_url or self.webhook_secret):
            raise KeyedError("token", "is not set but webhook settings are; set TELEGRAM_BOT_TOKEN (the token from @BotFather), or remove the webhook keys")
        return self

    def credential_problem(self) -> str | None:
        return None if self.token else "platforms.telegram.token is not set"


class DiscordConfig(_PlatformConfig):
    PLATFORM: ClassVar[str] = "discord"
    token: str = _secret()
    api_base_url: HttpUrl = "https://discord.com/api/v10"
    gateway_url: Annotated[Annotated[str, AfterValidator(_check_url(("ws", "wss")))] | None, BeforeValidator(_empty_to_none)] = None

    def credential_problem(self) -> str | None:
        return None if self.token else "platforms.discord.token is not set"


class SlackConfig(_PlatformConfig):
    PLATFORM: ClassVar[str] = "slack"
    bot_token: str = _secret()  # xoxb-...
    app_token: str = _secret()  # xapp-..., socket mode
    signing_secret: str = _secret()  # http mode
    mode: Literal["socket", "http"] = "socket"
    http_port: int = Field(3000, ge=0, le=65535)
    http_path: str = "/slack/events"
    api_base_url: HttpUrl = "https://slack.com/api/"

    @field_validator("http_path")
    @classmethod
    def _absolute_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f'must start with "/", like /slack/events (got {_config_load.describe(value)})')
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


class PlatformsConfig(_Model):
    telegram: TelegramConfig = TelegramConfig()
    discord: DiscordConfig = DiscordConfig()
    slack: SlackConfig = SlackConfig()


# --------------------------------------------------------------------------- the rest


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8642, ge=0, le=65535)
    token: str = _secret()

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ApiConfig:
        if not self.token and not _is_loopback(self.host):
            raise KeyedError(
                "token",
                f"must be set when api.host is {self.host} (not loopback): anyone who can reach it could drive the agent; "
                "set api.token (e.g. ${SWITCHBOARD_API_TOKEN}) or use host 127.0.0.1",
            )
        return self


class LoggingConfig(_Model):
    level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v),
    ] = "INFO"
    format: Literal["auto", "text", "json"] = "auto"


class ShutdownConfig(_Model):
    grace_seconds: float = Field(30.0, ge=0)


class CompressionConfig(_Model):
    enabled: bool = True
    threshold: float = Field(0.75, gt=0, le=1)  # fraction of model.context_length
    model: OptionalText = None  # None: model.name
    timeout_seconds: Seconds = 120.0  # the summarizer's budget; on timeout nothing changes
    cooldown_seconds: Seconds = 600.0  # after a failed compression, no retry for this session for this long


class RecallConfig(_Model):
    model: OptionalText = None  # None: model.name


class FactWeightsConfig(_Model):
    fts: float = Field(0.4, ge=0)
    jaccard: float = Field(0.3, ge=0)
    hrr: float = Field(0.3, ge=0)


class FactsConfig(_Model):
    """Holographic fact memory (issue 9, gateway.memory.facts)."""

    enabled: bool = True
    model: OptionalText = None  # the extraction model; None: model.name
    dimension: int = Field(1024, ge=64, le=16384)  # HRR vector length; changing it re-encodes facts as they are read
    weights: FactWeightsConfig = FactWeightsConfig()
    half_life_days: float = Field(90.0, ge=0)  # a fact confirmed this long ago counts half; 0: no decay
    prefetch: bool = True  # relevant facts go with each message to the model (per chat: /facts on|off)
    limit: int = Field(5, ge=1, le=50)  # facts per prefetch and per search
    extract_delay_seconds: float = Field(60.0, ge=0)  # an ended session waits this long before its facts are extracted


class CronJobConfig(BaseModel):
    """One scheduled job, loosely typed for now: the cron module validates the fields it uses."""

    model_config = ConfigDict(frozen=True, extra="allow", coerce_numbers_to_str=True)
    id: str | None = None
    name: str | None = None
    schedule: str | None = None
    prompt: str | None = None
    deliver: Any = None
    model: str | None = None
    context: Any = None


class CronConfig(_Model):
    jobs: tuple[CronJobConfig, ...] = ()


class StoreConfig(_Model):
    write_timeout_seconds: Seconds = 10.0
    # Ended sessions with no activity for this many days are deleted by the daemon, once a day; empty: never.
    retention_days: Annotated[float | None, BeforeValidator(_empty_to_none)] = Field(None, ge=1)


# --------------------------------------------------------------------------- Config


def _default_home(env: Mapping[str, str]) -> str:
    return env.get("SWITCHBOARD_HOME") or "~/.switchboard"


class Config(_Model):
    """The whole validated configuration."""

    home: Path
    agent: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    timezone: str = "UTC"
    model: ModelConfig = ModelConfig()
    sessions: SessionsConfig = SessionsConfig()
    auth: AuthConfig = AuthConfig()
    identities: IdentityMap = Field(default_factory=lambda: MappingProxyType({}))
    platforms: PlatformsConfig = PlatformsConfig()
    api: ApiConfig = ApiConfig()
    logging: LoggingConfig = LoggingConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    compression: CompressionConfig = CompressionConfig()
    recall: RecallConfig = RecallConfig()
    facts: FactsConfig = FactsConfig()
    cron: CronConfig = CronConfig()
    store: StoreConfig = StoreConfig()

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _fill_home(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and data.get("home") in (None, ""):
            env = (info.context or {}).get("env", os.environ)
            data = {**data, "home": _default_home(env)}
        return data

    @field_validator("home")
    @classmethod
    def _resolve_home(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve_path(value, info)

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {_config_load.describe(value)}; use an IANA name like Europe/Berlin, America/New_York or UTC") from None
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        owners: dict[str, str] = {}
        for name, refs in self.identities.items():
            for i, ref in enumerate(refs):
                if ref in owners:
                    raise KeyedError(f"identities.{name}.{i}", f"{ref} is already listed under identity {owners[ref]!r}; an account belongs to one identity")
                owners[ref] = name
        owner = self.auth.owner
        if owner is not None and owner not in self.identities:
            known = ", ".join(self.identities) or "none defined"
            raise KeyedError("auth.owner", f"{owner!r} is not a name under identities (known: {known}); add identities.{owner}: [platform:user_id, ...]")
        return self

    # -- derived values

    @property
    def source(self) -> Path | None:
        """The file this config was loaded from (None when built in code)."""
        return self._source

    @property
    def tzinfo(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def db_path(self) -> Path:
        return self.home / "state.db"

    def enabled_platforms(self) -> dict[str, str]:
        """Each platform -> "on", or "off: <reason>"."""
        out = {}
        for name in PLATFORMS:
            platform: _PlatformConfig = getattr(self.platforms, name)
            if not platform.enabled:
                out[name] = f"off: platforms.{name}.enabled is false"
            else:
                problem = platform.credential_problem()
                out[name] = f"off: {problem}" if problem else "on"
        return out

    def allowed_user_ids(self, platform: str) -> frozenset[str]:
        """User ids allowed on one platform: auth.allowed_users for it plus platforms.<p>.allowed_users."""
        prefix = f"{platform}:"
        ids = {ref[len(prefix):] for ref in self.auth.allowed_users if ref.startswith(prefix)}
        if platform in PLATFORMS:
            ids.update(getattr(self.platforms, platform).allowed_users)
        return frozenset(ids)

    def _secret_fields(self) -> list[tuple[tuple[str, ...], str]]:
        found: list[tuple[tuple[str, ...], str]] = []

        def walk(model: BaseModel, path: tuple[str, ...]) -> None:
            for name, field in type(model).model_fields.items():
                value = getattr(model, name)
                extra = field.json_schema_extra
                if isinstance(extra, dict) and extra.get("secret"):
                    found.append((path + (name,), value))
                elif isinstance(value, _Model):
                    walk(value, path + (name,))

        walk(self, ())
        return found

    def secrets(self) -> list[str]:
        """Every secret value that is set, for the log redactor."""
        return [value for _, value in self._secret_fields() if value]

    def redacted(self) -> dict:
        """The effective config as plain data (JSON types), every set secret replaced by "***"."""
        data = self.model_dump(mode="json")
        for path, value in self._secret_fields():
            if value:
                node = data
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = REDACTED
        return data


# --------------------------------------------------------------------------- loading


def find_config_path(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the config file is: ``explicit`` (``--config``), else
    ``$SWITCHBOARD_CONFIG``, else ``$SWITCHBOARD_HOME/config.yaml``, else
    ``~/.switchboard/config.yaml``.  The file may not exist."""
    return _config_load.locate(explicit, os.environ if env is None else env)[0]


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """Read, expand and validate the config file; raise ConfigError (exit 78) on any problem.

    ``env`` (default ``os.environ``) is used to find the file, for ``${VAR}``
    expansion and for the default ``home``.
    """
    env = os.environ if env is None else env
    found, source = _config_load.locate(path, env)
    shown = str(found)
    text = _config_load.read_text(found, source)
    data = _config_load.parse_yaml(text, shown)
    data = _config_load.expand_env(data, env, shown)
    try:
        config = Config.model_validate(data, context={"env": env, "base_dir": found.resolve().parent})
    except ValidationError as exc:
        raise _config_load.translate(exc, Config, shown) from None
    config._source = found
    return config


def config_from_dict(data: Mapping[str, Any], *, env: Mapping[str, str] | None = None, base_dir: str | Path | None = None) -> Config:
    """Validate an in-memory mapping (tests, tools) with the same errors as load_config (file=None)."""
    env = os.environ if env is None else env
    try:
        return Config.model_validate(dict(data), context={"env": env, "base_dir": Path(base_dir or Path.cwd())})
    except ValidationError as exc:
        raise _config_load.translate(exc, Config, None) from None

