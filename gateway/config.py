"""The gateway's configuration: one YAML file, validated once into frozen objects.

    cfg = load_config()                  # --config path, else $SWITCHBOARD_CONFIG, else $SWITCHBOARD_HOME/config.yaml
    cfg.platforms.telegram.token         # "" when not set (the model is adapters/telegram/config.py's)
    cfg.enabled_platforms()              # {"telegram": "on", "discord": "off: platforms.discord.token is not set", ...}
    cfg.sessions.reset_policy_for("telegram", "group")

Each platform's section is validated by the model its adapter package
publishes under the ``switchboard.adapter_configs`` entry point (a
:class:`PlatformConfig` subclass beside the adapter's code), so the gateway
never imports an adapter; ``config.example.yaml`` documents them all.

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

import functools
import ipaddress
import os
import re
import secrets
import socket
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal, Mapping
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from gateway import _config_load
from gateway._config_load import KeyedError, describe
from gateway.durations import parse_duration
from gateway.errors import ConfigError
from gateway.platforms import ADAPTER_CONFIGS, in_platform_order, installed_platforms
from gateway.types import Capabilities, CredentialCheck, SetupGuide

__all__ = [
    "ApiConfig",
    "AuthConfig",
    "BudgetRuleConfig",
    "BudgetsConfig",
    "CompressionConfig",
    "Config",
    "CronConfig",
    "MediaConfig",
    "CronJobConfig",
    "LoggingConfig",
    "MediaConfig",
    "ModelConfig",
    "NamedModelConfig",
    "DEFAULT_MODEL",
    "PlatformConfig",
    "PlatformsConfig",
    "RecallConfig",
    "ResetByPlatform",
    "ResetConfig",
    "ResetOverride",
    "ResetPolicy",
    "SessionsConfig",
    "ShutdownConfig",
    "StoreConfig",
    "StreamingConfig",
    "PlatformStreamingConfig",
    "config_from_dict",
    "find_config_path",
    "load_config",
    "platform_models",
    # what a platform's config model is built from
    "HttpUrl",
    "KeyedError",
    "OptionalHttpUrl",
    "Seconds",
    "check_url",
    "describe",
    "empty_to_none",
    "secret_field",
]

CHAT_TYPES: tuple[str, ...] = ("dm", "group", "thread", "channel")
REDACTED = "***"
MIN_MAPPED_SECRET = 8  # shorter env values (flags, levels) are settings, not secrets

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


def secret_field(**kwargs: Any) -> Any:
    """A secret string field: empty when unset, hidden from repr, redacted by Config.redacted(),
    never echoed in an error message."""
    return Field("", repr=False, json_schema_extra={"secret": True}, **kwargs)


def empty_to_none(value: Any) -> Any:
    # `${TELEGRAM_WEBHOOK_URL:-}` expands to "": that means "not set".
    return None if isinstance(value, str) and value.strip() == "" else value


def check_url(schemes: tuple[str, ...]):
    """A validator for a URL with one of ``schemes`` (None passes: an optional URL that is unset)."""
    def check(value: str | None) -> str | None:
        if value is None:
            return value
        scheme, sep, rest = value.partition("://")
        if not sep or scheme.lower() not in schemes or not rest or rest.startswith("/"):
            starts = " or ".join(f"{scheme}://" for scheme in schemes)
            raise ValueError(f"must be a URL starting with {starts} (got {_config_load.describe(value)})")
        return value

    return check


HttpUrl = Annotated[str, AfterValidator(check_url(("http", "https")))]
OptionalHttpUrl = Annotated[HttpUrl | None, BeforeValidator(empty_to_none)]
OptionalText = Annotated[str | None, BeforeValidator(empty_to_none)]
Seconds = Annotated[float, Field(gt=0)]


def _check_user_ref(value: str) -> str:
    platform, sep, user_id = value.partition(":")
    platform = platform.strip().lower()
    user_id = user_id.strip()
    if not sep or platform not in installed_platforms() or not user_id or any(c.isspace() for c in user_id):
        raise ValueError(
            f"must be platform:user_id with platform one of {', '.join(installed_platforms())} (the installed ones), "
            f'like "telegram:123456789" or "slack:U0123ABCD" (got {_config_load.describe(value)})'
        )
    return f"{platform}:{user_id}"


UserRef = Annotated[str, AfterValidator(_check_user_ref)]


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    value = value.expanduser()
    if not value.is_absolute():
        base = (info.context or {}).get("base_dir") or Path.cwd()
        value = Path(base) / value
    return value


# --------------------------------------------------------------------------- model


class ModelConfig(_Model):
    """The OpenAI-compatible endpoint the agent talks to."""

    base_url: HttpUrl = "http://127.0.0.1:8000/v1"
    api_key: str = secret_field()
    name: str = Field("default", min_length=1)
    context_length: Annotated[int | None, BeforeValidator(empty_to_none)] = Field(None, ge=512)  # None: known-model table, else a default
    timeout_seconds: Seconds = 120.0
    max_concurrent_calls: int = Field(4, ge=1, le=256)
    vision: bool = False
    max_retries: int = Field(3, ge=0, le=20)
    retry_total_seconds: Seconds = 90.0
    persona: OptionalText = None
    persona_file: Annotated[Path | None, BeforeValidator(empty_to_none)] = None
    max_tool_iterations: int = Field(8, ge=1, le=100)
    # a message estimated above this share of the context window is stored whole but sent cut down
    max_message_share: float = Field(0.5, ge=0.05, le=1)
    # Whether the model's reasoning (reasoning, reasoning_content, reasoning_details, encrypted reasoning
    # items) is sent back to it: within a tool loop, also in later turns, or never.
    replay_reasoning: Literal["tool_loop", "always", "never"] = "tool_loop"
    # Consecutive user messages (a burst answered by one turn) joined into one user message in the
    # prompt, for chat templates that demand strict user/assistant alternation; stored apart either way.
    merge_user_messages: bool = False
    # Whether the model takes tools and streams its answers (a fallback lacking one is skipped / not streamed).
    tools: bool = True
    streaming: bool = True
    # Names under ``models`` tried in this order when this model fails (refused, timed out, 5xx after
    # the retries, a 429 asking to wait longer than max_wait_seconds, an unknown model name).
    fallbacks: tuple[str, ...] = ()
    # A 429 whose Retry-After is longer than this moves to the next model at once (shorter: waited out).
    max_wait_seconds: float = Field(5.0, ge=0)
    # A model that failed is kept out of the chain this long at most (probed in the background meanwhile).
    breaker_seconds: Seconds = 30.0

    @field_validator("persona_file")
    @classmethod
    def _persona_file_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        value = _resolve_path(value, info)
        if not value.is_file():
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


class ModelPrice(_Model):
    """``pricing.<model>``: US dollars per million tokens."""

    input: float = Field(ge=0)  # input tokens not read from the provider's cache
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)  # input tokens read from the cache; empty: the input price

    def as_dict(self) -> dict[str, float]:
        return {"input": self.input, "output": self.output,
                "cached_input": self.input if self.cached_input is None else self.cached_input}


Pricing = Annotated[
    Mapping[str, ModelPrice],
    AfterValidator(lambda m: MappingProxyType(dict(m))),
    PlainSerializer(dict),
]


def _check_allowed_ref(value: str) -> str:
    """``models.<name>.allowed_for``: platform:user_id, api:<caller> (the local API's X-Session-Key or
    ``user``), or a chat's session key (agent:...)."""
    value = value.strip()
    if value.startswith(("agent:", "api:")):
        if any(c.isspace() for c in value) or value in ("agent:", "api:"):
            raise ValueError(f"a chat key or api:<caller> has no spaces (got {_config_load.describe(value)})")
        return value
    return _check_user_ref(value)


AllowedRef = Annotated[str, AfterValidator(_check_allowed_ref)]


class NamedModelConfig(_Model):
    """``models.<name>``: one more endpoint the chain (``model.fallbacks``) may use, or a chat may choose
    (``/model NAME``; the local API's ``model`` field; a cron job's ``model``)."""

    base_url: HttpUrl
    api_key: str = secret_field()
    name: str = Field(min_length=1)  # the model name as the endpoint knows it
    context_length: Annotated[int | None, BeforeValidator(empty_to_none)] = Field(None, ge=512)
    pricing: ModelPrice | None = None  # added to ``pricing`` under ``name``
    vision: bool = False
    tools: bool = True
    streaming: bool = True
    # Who may choose this model: platform:user_id and/or chat (session) keys; None (absent): everyone.
    allowed_for: tuple[AllowedRef, ...] | None = None


NamedModels = Annotated[
    Mapping[str, NamedModelConfig],
    AfterValidator(lambda m: MappingProxyType(dict(m))),
    PlainSerializer(dict),
]
DEFAULT_MODEL = "default"  # the name of the ``model`` section in the chain


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
    """``sessions.reset.by_platform``: one optional override per installed platform.
    :meth:`concrete_model` is the model with those keys."""

    UNKNOWN_KEY_HELP: ClassVar[str] = "these are the installed platforms; another one comes with its adapter package"

    @classmethod
    def concrete_model(cls) -> type[ResetByPlatform]:
        return _reset_by_platform_model(installed_platforms())

    def override_for(self, platform: str) -> ResetOverride | None:
        """This platform's override; None when it has none (or is not installed)."""
        return getattr(self, platform) if platform in type(self).model_fields else None


@functools.cache
def _reset_by_platform_model(names: tuple[str, ...]) -> type[ResetByPlatform]:
    fields: dict[str, Any] = {name: (ResetOverride | None, None) for name in names}
    return create_model("InstalledResetByPlatform", __base__=ResetByPlatform, **fields)


class ResetByType(_Model):
    dm: ResetOverride | None = None
    group: ResetOverride | None = None
    thread: ResetOverride | None = None
    channel: ResetOverride | None = None


class ResetConfig(_Model):
    mode: ResetMode = "both"
    idle_minutes: int = Field(1440, ge=1)
    at_hour: int = Field(4, ge=0, le=23)
    by_platform: SerializeAsAny[ResetByPlatform] = Field(default_factory=lambda: ResetByPlatform.concrete_model()())
    by_type: ResetByType = ResetByType()

    @field_validator("by_platform", mode="before")
    @classmethod
    def _installed_platforms(cls, value: Any, info: ValidationInfo) -> Any:
        # Validated here rather than by the field's type: the keys are the installed platforms.
        if isinstance(value, ResetByPlatform):
            return value
        return ResetByPlatform.concrete_model().model_validate(value, context=info.context)


def _duration_seconds(value: Any) -> Any:
    """``1h``, ``30m``, ``2d`` (as cron's schedules take them) or a number of seconds."""
    if isinstance(value, str):
        return parse_duration(value.strip())
    return value


class SessionsConfig(_Model):
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False
    reset: ResetConfig = Field(default_factory=ResetConfig)  # built when used: its keys are the installed platforms
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
        by_platform = r.by_platform.override_for(platform)
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


class PlatformStreamingConfig(_Model):
    """``platforms.<name>.streaming``: this platform's own choice; unset keys follow ``streaming``."""

    enabled: bool | None = None
    edit_interval_seconds: Annotated[float | None, Field(ge=0.25)] = None


class PlatformConfig(_Model):
    """What every platform's section has; each adapter package derives its own model from this
    (``adapters/telegram/config.py``) and publishes it under the ``switchboard.adapter_configs``
    entry point named like the platform."""

    PLATFORM: ClassVar[str] = ""
    enabled: bool = True
    allowed_users: tuple[str, ...] = ()
    require_mention: bool = True
    free_response_channels: tuple[str, ...] = ()
    stall_timeout_seconds: Seconds = 120.0
    streaming: PlatformStreamingConfig = PlatformStreamingConfig()
    # the pause between edits of a streamed reply when neither section sets one (the platform's own pace)
    STREAM_EDIT_INTERVAL: ClassVar[float] = 1.0
    # what the platform can do (gateway.types.Capabilities); each package declares its own
    CAPABILITIES: ClassVar[Capabilities] = Capabilities()
    # paths of the local API this platform answers (aiohttp syntax, "/webhooks/{name}"): the gateway mounts
    # them while the platform is on and hands each request to its adapter (gateway.types.HttpInbound)
    HTTP_PATHS: ClassVar[tuple[str, ...]] = ()
    # the module the platform's own extra (switchboard[<name>]) brings; `config extras` asks for the extra
    # when the platform is on and the module is missing (None: no library beyond the base install)
    LIBRARY: ClassVar[str | None] = None
    # how a cron job's `deliver` names a chat here ("" : <platform>:<chat_id>[:<thread_id>]), and whether
    # a thread may follow the chat id
    TARGET_FORM: ClassVar[str] = ""
    TARGET_THREADS: ClassVar[bool] = True
    # how `switchboard setup` asks for this platform's values (None: the operator sets it in the config by hand)
    SETUP: ClassVar[SetupGuide | None] = None

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

    def connection_identity(self) -> str | None:
        """What names the one connection of this section that a cluster may hold on one instance at a time
        (a mailbox, a bot's poller), or None when every instance may serve; hashed into the connection's
        key by ``gateway.runtime.cluster.connection_key``, never stored or logged as it is."""
        return None

    def cluster_problem(self) -> tuple[str, str] | None:
        """Why this section cannot run in a cluster, as (its key, what is wrong and what to do), or None."""
        return None

    async def probe(self, timeout: float) -> tuple[bool, str, str] | None:
        """``switchboard doctor``'s check of a platform that has no ``credential_check`` call: (ok, what was
        found, how to fix it), never a secret in either; None when the platform offers none."""
        return None

    def credential_check(self) -> CredentialCheck | None:
        """The call ``switchboard doctor`` makes to see whether the credentials work; None: the platform
        checks itself (:meth:`probe`), or there is nothing to ask it (the webhook's senders sign their own
        requests)."""
        return None

    @classmethod
    def target_form(cls) -> str:
        return cls.TARGET_FORM or f"{cls.PLATFORM}:<chat_id>[:<thread_id>]"

    @classmethod
    def check_target(cls, chat: str, thread: str | None) -> str | None:
        """Why ``chat`` (and ``thread``) cannot be a chat of this platform, or None (the adapter judges the rest)."""
        return None


@functools.cache
def platform_models() -> Mapping[str, type[PlatformConfig]]:
    """Each installed platform's config model, found through the ``switchboard.adapter_configs``
    entry points (so the gateway never imports an adapter): the built-in platforms in their usual
    order, then any others by name."""
    found: dict[str, type[PlatformConfig]] = {}
    for ep in entry_points(group=ADAPTER_CONFIGS):
        try:
            model = ep.load()
        except Exception as exc:  # noqa: BLE001 - an installed package is broken: say which, exit 78
            raise ConfigError(f"the settings model of the installed platform {ep.name} ({ep.value}) cannot be loaded "
                              f"({type(exc).__name__}: {exc}); reinstall or uninstall the package that provides it",
                              key=f"platforms.{ep.name}") from None
        if not (isinstance(model, type) and issubclass(model, PlatformConfig)) or model.PLATFORM != ep.name:
            raise ConfigError(f"the {ADAPTER_CONFIGS} entry point {ep.name} = {ep.value} must name a "
                              f"gateway.config.PlatformConfig subclass whose PLATFORM is {ep.name!r}; "
                              "fix or uninstall the package that provides it", key=f"platforms.{ep.name}")
        found[ep.name] = model
    return MappingProxyType({name: found[name] for name in in_platform_order(found)})


class PlatformsConfig(_Model):
    """The ``platforms`` section: one key per installed platform, each validated by the model that
    platform publishes (:func:`platform_models`).  :meth:`concrete_model` is the model with those keys."""

    UNKNOWN_KEY_HELP: ClassVar[str] = "these are the installed platforms; a platform's settings come with its adapter package"

    @classmethod
    def concrete_model(cls) -> type[PlatformsConfig]:
        return _platforms_model(tuple(platform_models().items()))

    def sections(self) -> dict[str, PlatformConfig]:
        """Platform name -> its validated section, in :func:`platform_models` order."""
        return {name: getattr(self, name) for name in type(self).model_fields}


@functools.cache
def _platforms_model(models: tuple[tuple[str, type[PlatformConfig]], ...]) -> type[PlatformsConfig]:
    fields: dict[str, Any] = {name: (model, Field(default_factory=model)) for name, model in models}
    return create_model("InstalledPlatformsConfig", __base__=PlatformsConfig, **fields)


# --------------------------------------------------------------------------- the rest


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8642, ge=0, le=65535)
    token: str = secret_field()

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ApiConfig:
        if not self.token and not is_loopback(self.host):
            raise KeyedError(
                "token",
                f"must be set when api.host is {self.host} (not loopback): anyone who can reach it could drive the agent; "
                "set api.token (e.g. ${SWITCHBOARD_API_TOKEN}) or use host 127.0.0.1",
            )
        return self


class A2aCallerConfig(_Model):
    """One agent allowed to call the A2A endpoint (``a2a.callers.<name>``)."""

    token: str = secret_field()  # its bearer token (``Authorization: Bearer ...``); required
    # Where its tasks' push notifications may go: a request's push config must name a URL starting with
    # this (empty: no push notifications for this caller).
    push_url: str | None = None

    _push = field_validator("push_url", mode="before")(empty_to_none)

    @model_validator(mode="after")
    def _has_token(self) -> A2aCallerConfig:
        if not self.token:
            raise KeyedError("token", "must be set: each A2A caller authenticates with its own bearer token "
                                      "(e.g. ${A2A_PLANNER_TOKEN}; openssl rand -hex 32)")
        if self.push_url is not None and not self.push_url.startswith(("http://", "https://")):
            raise KeyedError("push_url", f"{self.push_url!r} is not an http:// or https:// URL")
        return self


class A2aConfig(_Model):
    """``a2a``: the Agent2Agent endpoint on the local API's port (off unless asked for)."""

    enabled: bool = False
    name: str = "Switchboard"  # the agent card's name
    description: str = "A chat agent with tools, reached over A2A."
    # The URL other agents reach the endpoint at (behind a proxy); empty: http://<api.host>:<api.port>/a2a
    public_url: str | None = None
    # Callers by name: each its own bearer token; the name is its user id (a2a:<name>) and part of its
    # session keys.  With none, only loopback callers are served, as the user ``local``.
    callers: Annotated[Mapping[str, A2aCallerConfig], AfterValidator(lambda m: MappingProxyType(dict(m))),
                       PlainSerializer(dict)] = Field(default_factory=lambda: MappingProxyType({}))
    push_attempts: int = Field(5, ge=1, le=20)  # tries per push notification before it is given up (logged)
    push_timeout_seconds: float = Field(10.0, gt=0, le=120)
    # How long SendMessage waits for the answer before it returns the task still working (GetTask, or
    # the push notification, then has the answer).
    wait_seconds: float = Field(60.0, gt=0, le=3600)

    _public = field_validator("public_url", mode="before")(empty_to_none)

    @field_validator("callers", mode="before")
    @classmethod
    def _caller_names(cls, value: Any) -> Any:
        for name in (value or {}):
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise KeyedError(str(name), "an A2A caller's name is letters, digits, '.', '_' or '-' (it is "
                                            "part of its session keys)")
        return value


class UiConfig(_Model):
    """``ui``: the web dashboard at ``/ui/`` on the local API's listener."""

    enabled: bool = False  # off unless asked for
    # On loopback without api.token the dashboard is read-only; this lets it run jobs and approve pairings too.
    allow_local_writes: bool = False
    # Reverse proxies (addresses or CIDR networks) whose X-Forwarded-For, X-Forwarded-Proto and Forwarded
    # headers say who the browser is and whether it used HTTPS; from any other peer they are ignored.
    trusted_proxies: tuple[str, ...] = ()
    # The session cookie is Secure whenever the browser's side is HTTPS; true makes it Secure always.
    cookie_secure: bool = False

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for index, value in enumerate(values):
            try:
                out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
            except ValueError:
                raise KeyedError(str(index), f"{value!r} is not an IP address or a CIDR network such as 10.0.0.0/8 "
                                             "or 127.0.0.1: name the reverse proxy's address as the daemon sees it") from None
        return tuple(out)


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
    """Holographic fact memory (gateway.memory.facts): facts kept across sessions for each user."""

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
    tools: Any = None


class CronConfig(_Model):
    jobs: tuple[CronJobConfig, ...] = ()


class StoreConfig(_Model):
    # Empty: SQLite at $home/state.db.  postgresql://user:password@host:5432/db: one PostgreSQL database
    # shared by every instance (pip install 'switchboard[postgresql]').  Secret: its password never shows.
    url: str = secret_field()
    write_timeout_seconds: Seconds = 10.0
    # Ended sessions with no activity for this many days are deleted by the daemon, once a day; empty: never.
    retention_days: Annotated[float | None, BeforeValidator(empty_to_none)] = Field(None, ge=1)

    @field_validator("url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        value = value.strip()
        if not value:
            return ""
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in ("postgresql", "postgres"):
            # only on this error path: loading the config loads no store.  mask_url stays in state: it knows
            # the store's URL forms and the store imports nothing above it; a home both could import at load
            # time would be a package below state for one function.
            from state import mask_url
            raise ValueError(f"must be empty (SQLite at $home/state.db) or a postgresql://user:password@host:5432/db "
                             f"URL, not one starting {mask_url(value)[:24]!r}")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as exc:
            from state import mask_url
            raise ValueError(f"is not a valid URL ({mask_url(value)}: {str(exc).split(':')[0]}); "
                             "write postgresql://user:password@host:5432/db, with any '@', ':' or '/' "
                             "in the password percent-encoded") from None
        return value


@functools.cache
def default_instance_id(pid: int | None = None) -> str:
    """``<hostname>-<pid>-<random>``: one per process (a reload keeps it), readable in /healthz and the
    database's rows; the random part tells apart processes whose pid was reused."""
    return f"{socket.gethostname()}-{os.getpid() if pid is None else pid}-{secrets.token_hex(3)}"


class ClusterConfig(_Model):
    """``cluster``: several instances on one PostgreSQL store (``store.url``); ignored on SQLite."""

    # A standby takes a dead owner's platform connection (Telegram poller, Discord gateway, Slack socket)
    # over within this many seconds; at least 5, the time the database needs to tell dead from slow.
    failover_seconds: float = Field(10.0, ge=5)
    lease_seconds: Seconds = 15.0  # how long a claim on a session's work holds without renewal
    # This instance's name in /healthz and the database; empty: <hostname>-<pid>-<random>.
    instance_id: str = Field("", pattern=r"^[A-Za-z0-9_.:@-]{0,63}$", validate_default=True)

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str) -> str:
        return value or default_instance_id(os.getpid())


class UsageConfig(_Model):
    # The usage ledger's rows older than this many days are deleted by the daemon, once a day; empty: kept
    # (they still go with their session when it is pruned).
    keep_days: Annotated[float | None, BeforeValidator(empty_to_none)] = Field(None, ge=1)


class MediaBytesConfig(_Model):
    """``media.max_bytes``: the most downloaded of one attachment, per kind; a larger one is described."""

    image: int = Field(10 * 1024 * 1024, ge=1)
    audio: int = Field(25 * 1024 * 1024, ge=1)
    document: int = Field(20 * 1024 * 1024, ge=1)


class MediaConfig(_Model):
    """``media``: pictures, voice and documents, kept as files outside the database (``gateway.media``)."""

    # Where the files go (content-addressed by SHA-256); empty: $home/media.  A shared volume when clustered.
    path: Annotated[Path | None, BeforeValidator(empty_to_none)] = None
    max_bytes: MediaBytesConfig = MediaBytesConfig()
    # The last this many images of a session go to a vision model again on later turns; 0: only on their own.
    images_in_context: int = Field(4, ge=0, le=32)
    # A vision model under ``models`` that describes an image once for a model without vision; empty: none.
    describe_with: OptionalText = None
    # A document's text (PDF, text, Markdown, CSV, JSON) is cut at this many characters.
    max_document_chars: int = Field(50_000, ge=100, le=2_000_000)
    # --- voice (gateway.voice), through the model endpoint's audio API ---
    # a transcription model (``whisper-1``) served at model.base_url's /audio/transcriptions; empty: voice
    # messages are described, not transcribed
    transcribe_with: OptionalText = None
    # a speech model (``tts-1``) at model.base_url's /audio/speech, for /voice on; empty: /voice is unavailable
    speak_with: OptionalText = None
    voice: str = Field("alloy", min_length=1)  # the speech model's voice
    max_audio_seconds: Seconds = 300.0  # longer voice messages are refused politely, not transcribed
    audio_timeout_seconds: Seconds = 60.0  # per transcription or speech call

    @field_validator("path")
    @classmethod
    def _resolve_media_path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve_path(value, info)


# --------------------------------------------------------------------------- tools


SecretMap = Annotated[
    Mapping[str, str],
    AfterValidator(lambda m: MappingProxyType(dict(m))),
    PlainSerializer(dict),
    Field(repr=False, json_schema_extra={"secret": True}),
]

MCP_SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$"  # and no "__": it separates server and tool
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


Approval = Literal["never", "always", "once_per_session"]


class McpServerConfig(_Model):
    """``tools.mcp_servers.<name>``: one MCP server, run over stdio (``command``) or reached by URL."""

    enabled: bool = True
    # stdio: the program, its arguments, where it runs, and its whole environment (besides PATH and HOME)
    command: OptionalText = None
    args: tuple[str, ...] = ()
    cwd: Path | None = None
    env: SecretMap = Field(default_factory=lambda: MappingProxyType({}))
    # streamable HTTP: the endpoint and the headers sent with every request (e.g. Authorization)
    url: OptionalHttpUrl = None
    headers: SecretMap = Field(default_factory=lambda: MappingProxyType({}))
    # globs over "<server>__<tool>": a tool is offered when an allow pattern matches and no deny pattern does
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    timeout_seconds: Seconds = 60.0  # per call
    # starting, connecting and signing in to the server (a per_user call's own connection too), at most
    connect_timeout_seconds: Seconds = 30.0
    max_output_bytes: int = Field(32768, ge=256)  # a longer result is cut here and marked
    max_concurrent_calls: int = Field(4, ge=1)
    # who must say yes before a tool runs: never | always (each call) | once_per_session (the first call)
    approval: Approval = "never"
    tool_approval: Annotated[  # per tool (its own name, as the server lists it), over ``approval``
        Mapping[str, Approval], AfterValidator(lambda m: MappingProxyType(dict(m))), PlainSerializer(dict),
    ] = Field(default_factory=lambda: MappingProxyType({}))
    # OAuth (an HTTP server): none | operator (one sign-in, the operator's, for every call) | per_user
    # (each person signs in with their own account, sent a link in the chat; their token is theirs alone)
    auth: Literal["none", "operator", "per_user"] = "none"
    scopes: tuple[str, ...] = ()  # the scopes asked for; empty: what the server's metadata names
    # a client registered by hand at the authorisation server (for servers that take neither a Client
    # ID Metadata Document nor dynamic registration); the secret, if it has one, from the environment
    client_id: OptionalText = None
    client_secret: str = secret_field()

    def approval_for(self, tool: str) -> str:
        """The approval ``tool`` (the server's own name for it) needs."""
        return self.tool_approval.get(tool, self.approval)

    @field_validator("cwd")
    @classmethod
    def _resolve_cwd(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve_path(value, info)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        bad = [k for k in value if not re.match(ENV_NAME, k)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))} is not an environment variable name (letters, digits, _)")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set either command (a stdio server) or url (a streamable HTTP server), not both or neither")
        if self.url is not None and (self.args or self.cwd or self.env):
            raise ValueError("args, cwd and env are for stdio servers (command); an HTTP server (url) takes headers")
        if self.command is not None and self.headers:
            raise ValueError("headers are for HTTP servers (url); a stdio server (command) takes env")
        if self.client_secret and not self.client_id:
            raise ValueError("client_secret belongs to a client_id (the client registered at the authorisation server)")
        if self.auth != "none" and self.command is not None:
            raise ValueError("auth (OAuth) is for HTTP servers (url); a stdio server takes its credentials in env")
        if self.auth != "none" and any(k.lower() == "authorization" for k in self.headers):
            raise ValueError(f"auth: {self.auth} sends the signed-in token as Authorization; remove that header "
                             "(or set auth: none to keep a static one)")
        return self


def _check_server_names(servers: Mapping[str, McpServerConfig]) -> Mapping[str, McpServerConfig]:
    for name in servers:
        if not re.match(MCP_SERVER_NAME, name) or "__" in name or name.endswith("_"):
            raise ValueError(f"MCP server name {describe(name)} must be 1-32 letters, digits, - and single _ "
                             f"(its tools are offered as <server>__<tool>)")
    return servers


class ToolRule(_Model):
    """``tools.rules[N]``: allow and/or deny globs over ``<server>__<tool>``, where all of its scopes match
    (a scope left out matches everything): agents, platforms, chats (``platform:chat_id``), users
    (``platform:user_id``)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    agents: tuple[str, ...] | None = None
    platforms: tuple[str, ...] | None = None
    chats: tuple[str, ...] | None = None
    users: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _says_something(self) -> ToolRule:
        if not self.allow and not self.deny:
            raise ValueError("a rule needs allow or deny globs over <server>__<tool> (e.g. allow: [\"files__read_*\"])")
        for field_name, example in (("chats", "telegram:-1001234567890"), ("users", "telegram:123456789")):
            for ref in getattr(self, field_name) or ():
                platform, sep, ident = ref.partition(":")
                if not sep or not platform or not ident or any(c.isspace() for c in ref):
                    raise ValueError(f"{field_name} are platform:id, like \"{example}\" or \"api:ann\" "
                                     f"(got {describe(ref)})")
        return self


class OAuthConfig(_Model):
    """``tools.oauth``: where the MCP servers' sign-ins come back (``auth: operator | per_user``)."""

    # where people's browsers reach the local API (the callback is <public_url>/mcp/oauth/callback);
    # unset: http://127.0.0.1:<api.port>, which works only for a browser on this machine
    public_url: OptionalHttpUrl = None
    # a Client ID Metadata Document's URL (https), used where the authorisation server takes one;
    # unset with an https public_url: <public_url>/mcp/oauth/client.json, which the local API serves.
    # Servers that take none are registered with dynamically (RFC 7591).
    client_id_url: OptionalHttpUrl = None
    client_name: str = "Switchboard"

    @field_validator("client_id_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is not None:
            scheme, _, rest = value.partition("://")
            host = rest.split("/", 1)[0].rsplit(":", 1)[0]
            if scheme != "https" and host not in ("127.0.0.1", "localhost", "[::1]"):
                raise ValueError("a Client ID Metadata Document is fetched over https (http only on loopback, to test)")
            if "/" not in rest or rest.endswith("://") or rest.split("/", 1)[1] == "":
                raise ValueError("a Client ID Metadata Document's URL needs a path (e.g. https://gw.example.org/mcp/oauth/client.json)")
        return value

    def callback_base(self, host: str, port: int) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"

    def metadata_url(self, host: str, port: int) -> str | None:
        if self.client_id_url:
            return self.client_id_url
        base = self.callback_base(host, port)
        return f"{base}/mcp/oauth/client.json" if base.startswith("https://") else None


class ToolsConfig(_Model):
    """``tools``: what the agent can act with beyond its own tools."""

    oauth: OAuthConfig = Field(default_factory=OAuthConfig)

    # who may use what beyond the servers' own allow/deny (gateway.tools_mcp.policy)
    rules: tuple[ToolRule, ...] = ()

    mcp_servers: Annotated[
        Mapping[str, McpServerConfig],
        AfterValidator(lambda m: MappingProxyType(dict(_check_server_names(m)))),
        PlainSerializer(dict),
    ] = Field(default_factory=lambda: MappingProxyType({}))
    # who may answer an approval besides the session's own user: identity names or platform:user_id
    approvers: tuple[str, ...] = ()
    approval_timeout: Seconds = 600.0  # an unanswered approval request is denied after this long

    @field_validator("approval_timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value


# --------------------------------------------------------------------------- Config


def _default_home(env: Mapping[str, str]) -> str:
    return env.get("SWITCHBOARD_HOME") or "~/.switchboard"


def _optional_duration(value: Any) -> Any:
    """Empty: None (off); else what :func:`_duration_seconds` takes (``1d``, ``6h``, seconds)."""
    return None if empty_to_none(value) is None else _duration_seconds(value)


class BackupConfig(_Model):
    """``backup``: online copies of state.db made by the daemon, each checked, the oldest rotated out (SQLite)."""

    every: Annotated[Seconds | None, BeforeValidator(_optional_duration)] = None  # 1d, 6h; empty: off
    keep: int = Field(7, ge=1, le=1000)  # the newest this many stay; older ones are deleted
    dir: Annotated[Path | None, BeforeValidator(empty_to_none)] = None  # empty: $home/backups

    @field_validator("dir")
    @classmethod
    def _resolve_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _resolve_path(value, info)


class TelemetryConfig(_Model):
    """``telemetry``: OpenTelemetry traces (the switchboard[otel] extra; on by the OTEL_* variables)."""

    include_content: bool = False  # message text, prompts and tool results in the spans; off: never


class LimitsConfig(_Model):
    """``limits``: messages answered per minute; past it a message is stored, not answered, and the user
    is told once when to try again.  Empty: no limit.  Counted in memory, per instance."""

    messages_per_minute: Annotated[int | None, BeforeValidator(empty_to_none)] = Field(None, ge=1)  # per user
    chat_messages_per_minute: Annotated[int | None, BeforeValidator(empty_to_none)] = Field(None, ge=1)  # per chat


BUDGET_SCOPE_KINDS = ("user", "chat", "platform", "cron", "gateway")
BUDGET_SOURCES = ("api",)  # besides the platforms: the local API's calls (platform:api, user:api:<caller>)


class BudgetRuleConfig(_Model):
    """``budgets.rules[]``: one scope, one period, one limit (``cost`` in the pricing's currency, or ``tokens``)."""

    scope: str = Field(min_length=1)  # user:<identity or platform:user_id>, chat:<platform:chat_id>, platform:<p>, cron:<job>, gateway
    period: Literal["day", "month"] = "day"  # in the config's timezone
    cost: Annotated[float | None, BeforeValidator(empty_to_none)] = Field(None, gt=0)
    tokens: Annotated[int | None, BeforeValidator(empty_to_none)] = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_limit(self) -> BudgetRuleConfig:
        if (self.cost is None) == (self.tokens is None):
            raise ValueError("give the rule one limit: cost (in the pricing's currency) or tokens, not both or neither")
        return self

    @property
    def kind(self) -> str:
        return "cost" if self.cost is not None else "tokens"

    @property
    def limit(self) -> float:
        return float(self.cost if self.cost is not None else self.tokens or 0)


class BudgetsConfig(_Model):
    """``budgets``: spend limits checked before every model call (see docs/configuration.md)."""

    rules: tuple[BudgetRuleConfig, ...] = ()
    notify: OptionalText = None  # platform:chat_id the operator is told in once a budget is used up
    # what a model without a price counts at under a cost rule (its tokens estimated when not reported)
    default_price: ModelPrice | None = None


def budget_scope_problem(scope: str, cfg: Config, cron_ids: set[str] | None = None) -> tuple[str, str | None]:
    """``scope`` normalized (an account linked to an identity is ``user:<identity>``), and what is wrong
    with it (None: nothing).  ``cron_ids``: the jobs a ``cron:`` scope may name (default: the config's)."""
    kind, _, rest = scope.strip().partition(":")
    rest = rest.strip()
    platforms = (*installed_platforms(), *BUDGET_SOURCES)
    if kind == "gateway":
        return ("gateway", None) if not rest else (scope, "gateway takes nothing after it; write just gateway")
    if kind == "platform":
        if rest not in platforms:
            return scope, f"{describe(rest)} is not a platform; use one of {', '.join(platforms)}"
        return f"platform:{rest}", None
    if kind == "user":
        if rest in cfg.identities:
            return f"user:{rest}", None
        try:
            account = rest if rest.startswith("api:") and len(rest) > 4 else _check_user_ref(rest)
        except ValueError:
            known = ", ".join(cfg.identities) or "none defined"
            return scope, (f"{describe(rest)} is neither a name under identities (known: {known}) nor an account "
                           "written platform:user_id")
        owner = next((name for name, refs in cfg.identities.items() if account in refs), None)
        return f"user:{owner or account}", None
    if kind == "chat":
        platform, sep, chat_id = rest.partition(":")
        if not sep or platform not in platforms or not chat_id.strip() or any(c.isspace() for c in chat_id):
            return scope, f"a chat is platform:chat_id with platform one of {', '.join(platforms)} (got {describe(rest)})"
        return f"chat:{platform}:{chat_id}", None
    if kind == "cron":
        ids = cron_ids if cron_ids is not None else {j.id for j in cfg.cron.jobs if j.id}
        if rest not in ids:
            return scope, (f"{describe(rest)} is not a job under cron.jobs (known: {', '.join(sorted(ids)) or 'none'}); "
                           "a job added with switchboard cron add gets its budget with switchboard budgets set")
        return f"cron:{rest}", None
    return scope, (f"a scope starts with one of {', '.join(BUDGET_SCOPE_KINDS)} "
                   f"(user:alice, chat:telegram:-100123, platform:slack, cron:digest, gateway), not {describe(scope)}")


class StreamingConfig(_Model):
    """``streaming``: replies shown as they are written, one message edited in place."""

    enabled: bool = True
    # seconds between edits; empty: each platform's own pace (Telegram 1.0, Discord 1.2, Slack 1.0)
    edit_interval_seconds: Annotated[float | None, Field(ge=0.25)] = None
    groups: bool = True  # stream in group chats too (edits there spend a tighter budget)
    first_chars: int = Field(40, ge=1, le=4000)  # the first text shows once this much arrived...
    first_after_seconds: Seconds = 1.0  # ...or this long after the first of it, whichever comes first

    def for_platform(self, section: PlatformConfig) -> tuple[bool, float]:
        """Whether ``section``'s platform streams, and the pause between its edits."""
        own = section.streaming
        enabled = self.enabled if own.enabled is None else own.enabled
        interval = own.edit_interval_seconds or self.edit_interval_seconds or section.STREAM_EDIT_INTERVAL
        return enabled, interval


class Config(_Model):
    """The whole validated configuration."""

    home: Path
    agent: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    timezone: str = "UTC"
    model: ModelConfig = ModelConfig()
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    auth: AuthConfig = AuthConfig()
    identities: IdentityMap = Field(default_factory=lambda: MappingProxyType({}))
    platforms: SerializeAsAny[PlatformsConfig] = Field(default_factory=lambda: PlatformsConfig.concrete_model()())
    api: ApiConfig = ApiConfig()
    ui: UiConfig = UiConfig()
    a2a: A2aConfig = Field(default_factory=A2aConfig)
    logging: LoggingConfig = LoggingConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    compression: CompressionConfig = CompressionConfig()
    recall: RecallConfig = RecallConfig()
    facts: FactsConfig = FactsConfig()
    cron: CronConfig = CronConfig()
    store: StoreConfig = StoreConfig()
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    streaming: StreamingConfig = StreamingConfig()
    pricing: Pricing = Field(default_factory=lambda: MappingProxyType({}))
    models: NamedModels = Field(default_factory=lambda: MappingProxyType({}))
    usage: UsageConfig = UsageConfig()
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    limits: LimitsConfig = LimitsConfig()
    media: MediaConfig = MediaConfig()
    backup: BackupConfig = BackupConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    budgets: BudgetsConfig = BudgetsConfig()

    _source: Path | None = PrivateAttr(default=None)
    _variables: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _fill_home(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and data.get("home") in (None, ""):
            env = (info.context or {}).get("env", os.environ)
            data = {**data, "home": _default_home(env)}
        return data

    @field_validator("platforms", mode="before")
    @classmethod
    def _platform_sections(cls, value: Any, info: ValidationInfo) -> Any:
        # Validated here rather than by the field's type: the keys are the installed platforms.
        if isinstance(value, PlatformsConfig):
            return value
        return PlatformsConfig.concrete_model().model_validate(value, context=info.context)

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
        for i, entry in enumerate(self.tools.approvers):
            if ":" not in entry and entry not in self.identities:
                known = ", ".join(self.identities) or "none defined"
                raise KeyedError(f"tools.approvers.{i}", f"{entry!r} is neither an identity name (known: {known}) nor "
                                                         "platform:user_id; write one of those")
        if DEFAULT_MODEL in self.models:
            raise KeyedError(f"models.{DEFAULT_MODEL}", f"{DEFAULT_MODEL!r} is the model section's own name; "
                                                        "give this model another name")
        for i, name in enumerate(self.model.fallbacks):
            if name not in self.models:
                known = ", ".join(self.models) or "none defined"
                raise KeyedError(f"model.fallbacks.{i}", f"{name!r} is not a name under models (known: {known}); "
                                                         f"add models.{name}: {{base_url, name, ...}}")
            if name in self.model.fallbacks[:i]:
                raise KeyedError(f"model.fallbacks.{i}", f"{name!r} is listed twice")
        if self.store.url and self.backup.every is not None:
            from state import mask_url
            raise KeyedError("backup.every", "automatic backups copy a SQLite state.db, and this store is PostgreSQL "
                             f"(store.url): remove backup.every and back it up with pg_dump, e.g. daily from cron: "
                             f"pg_dump --format=custom --file=switchboard-$(date +%F).dump '{mask_url(self.store.url)}' "
                             "(give the password in ~/.pgpass or PGPASSWORD; pg_restore puts it back)")
        for name, platform in self.platforms.sections().items() if self.store.url else ():
            on = platform.enabled and platform.credential_problem() is None
            problem = platform.cluster_problem() if on else None
            if problem is not None:
                raise KeyedError(f"platforms.{name}.{problem[0]}", problem[1])
        describer = self.media.describe_with
        if describer is not None and (describer not in self.models or not self.models[describer].vision):
            known = ", ".join(n for n, m in self.models.items() if m.vision) or "none defined"
            raise KeyedError("media.describe_with", f"{describer!r} is not a model with vision under models "
                                                    f"(known: {known}); add models.{describer}: "
                                                    "{base_url, name, vision: true}")
        for i, job in enumerate(self.cron.jobs):
            if job.model is not None and job.model not in self.model_names:
                raise KeyedError(f"cron.jobs.{i}.model", f"{job.model!r} is not a model name; use one of "
                                                         f"{', '.join(self.model_names)} (models: and default)")
        self._check_budgets()
        return self

    def _check_budgets(self) -> None:
        names: dict[str, int] = {}
        for i, rule in enumerate(self.budgets.rules):
            scope, problem = budget_scope_problem(rule.scope, self)
            if problem is not None:
                raise KeyedError(f"budgets.rules.{i}.scope", problem)
            name = f"{scope}/{rule.period}/{rule.kind}"
            if name in names:
                raise KeyedError(f"budgets.rules.{i}", f"a {rule.period} {rule.kind} limit for {scope} is already "
                                                       f"budgets.rules[{names[name]}]; keep one")
            names[name] = i
        notify = self.budgets.notify
        if notify is not None:
            platform, sep, chat_id = notify.partition(":")
            if not sep or platform not in installed_platforms() or not chat_id.strip():
                raise KeyedError("budgets.notify", f"must be platform:chat_id with platform one of "
                                                   f"{', '.join(installed_platforms())} (got {describe(notify)})")

    # -- derived values

    @property
    def source(self) -> Path | None:
        """The file this config was loaded from (None when built in code)."""
        return self._source

    def variables_for(self, key: str) -> tuple[str, ...]:
        """The environment variables that set ``key``'s value (``platforms.telegram.token`` ->
        ``("TELEGRAM_BOT_TOKEN",)``); empty when the file wrote it, or the config was built in code."""
        return self._variables.get(key, ())

    def named(self, key: str) -> str:
        """``key`` as an error names it: ``TELEGRAM_BOT_TOKEN (platforms.telegram.token)`` when a variable set it."""
        names = self.variables_for(key)
        return f"{', '.join(names)} ({key})" if names else key

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names a chat, a cron job or an API request may choose: ``default`` and the keys of ``models``."""
        return (DEFAULT_MODEL, *self.models)

    @property
    def all_pricing(self) -> Mapping[str, ModelPrice]:
        """``pricing`` with each named model's own ``pricing`` under its model name (``pricing`` wins)."""
        named = {m.name: m.pricing for m in self.models.values() if m.pricing is not None}
        return MappingProxyType({**named, **self.pricing})

    @property
    def tzinfo(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def db_path(self) -> Path:
        return self.home / "state.db"

    @property
    def backup_dir(self) -> Path:
        """Where automatic backups go: ``backup.dir``, else ``$home/backups``."""
        return self.backup.dir or self.home / "backups"

    @property
    def media_path(self) -> Path:
        """Where the media store keeps its files: ``media.path``, else ``$home/media``."""
        return self.media.path or self.home / "media"

    @property
    def clustered(self) -> bool:
        """Whether this instance cooperates with others (``cluster``): only on a PostgreSQL store."""
        return bool(self.store.url)

    @property
    def store_target(self) -> Path | str:
        """What ``state.SessionDB`` opens: ``store.url`` (PostgreSQL) when set, else ``db_path``."""
        return self.store.url or self.db_path

    def enabled_platforms(self) -> dict[str, str]:
        """Each platform -> "on", or "off: <reason>"."""
        out = {}
        for name, platform in self.platforms.sections().items():
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
        section = self.platforms.sections().get(platform)
        if section is not None:
            ids.update(section.allowed_users)
        return frozenset(ids)

    def _secret_fields(self) -> list[tuple[tuple[str, ...], str]]:
        found: list[tuple[tuple[str, ...], str]] = []

        def walk(model: BaseModel, path: tuple[str, ...]) -> None:
            for name, field in type(model).model_fields.items():
                value = getattr(model, name)
                extra = field.json_schema_extra
                if isinstance(extra, dict) and extra.get("secret"):
                    found.append((path + (name,), value))
                elif isinstance(value, BaseModel):  # a platform package's own models are plain pydantic ones
                    walk(value, path + (name,))
                elif isinstance(value, Mapping):  # named sections: models.<name>.api_key, tools.mcp_servers.<name>,
                    for key, item in value.items():  # platforms.webhook.hooks.<name>.secret
                        if isinstance(item, BaseModel):
                            walk(item, path + (name, key))

        walk(self, ())
        return found

    def secrets(self) -> list[str]:
        """Every secret value that is set, for the log redactor (store.url's password on its own too)."""
        found: list[str] = []
        for _, value in self._secret_fields():
            if isinstance(value, Mapping):  # an MCP server's env and headers: every value long enough to be one
                found += [v for v in value.values() if len(v) >= MIN_MAPPED_SECRET]
            elif value:
                found.append(value)
        if self.store.url:
            password = urlsplit(self.store.url).password
            if password:
                found.append(password)
        return found

    def redacted(self) -> dict:
        """The effective config as plain data (JSON types), every set secret replaced by "***"."""
        data = self.model_dump(mode="json")
        for path, value in self._secret_fields():
            if value:
                node = data
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = {k: REDACTED for k in value} if isinstance(value, Mapping) else REDACTED
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
    sources: dict[str, list[tuple[str, str]]] = {}
    env = _config_load.with_env_file(found, env)
    data = _config_load.expand_env(data, env, shown, sources=sources)
    try:
        config = Config.model_validate(data, context={"env": env, "base_dir": found.resolve().parent})
    except ValidationError as exc:
        raise _config_load.translate(exc, Config, shown, sources) from None
    config._source = found
    config._variables = {key: tuple(name for name, _value in found_in) for key, found_in in sources.items()}
    return config


def config_from_dict(data: Mapping[str, Any], *, env: Mapping[str, str] | None = None, base_dir: str | Path | None = None) -> Config:
    """Validate an in-memory mapping (tests, tools) with the same errors as load_config (file=None)."""
    env = os.environ if env is None else env
    try:
        return Config.model_validate(dict(data), context={"env": env, "base_dir": Path(base_dir or Path.cwd())})
    except ValidationError as exc:
        raise _config_load.translate(exc, Config, None) from None

