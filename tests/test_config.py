"""The config file: the example loads, mistakes give one line and exit 78, secrets stay hidden."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from adapters.discord.config import DiscordConfig
from adapters.email.config import EmailConfig
from adapters.lark.config import LarkConfig
from adapters.matrix.config import MatrixConfig
from adapters.signal.config import SignalConfig
from adapters.slack.config import SlackConfig
from adapters.teams.config import TeamsConfig
from adapters.telegram.config import TelegramConfig
from adapters.webhook.config import WebhookConfig
from adapters.whatsapp.config import WhatsAppConfig
from gateway.cli.config import config_group
from gateway.config import Config, ResetPolicy, config_from_dict, find_config_path, load_config, platform_models
from gateway.errors import ConfigError
from gateway.platforms import BUILT_IN, installed_platforms

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.yaml"

TG_TOKEN = "123456789:AAHfakeTelegramTokenForTests_0123456789"
DISCORD_TOKEN = "discord-token-value-for-tests-0001"
SLACK_BOT = "xoxb-1111-2222-fakebottoken"
SLACK_APP = "xapp-1-A111-2222-fakeapptoken"
MODEL_KEY = "sk-test-model-key-0000000000000"
API_TOKEN = "api-token-for-tests-123"
WEBHOOK_SECRET = "hook_secret-123"
EMAIL_PASSWORD = "email-password-for-tests-42"
MATRIX_TOKEN = "syt_matrix_token_for_tests_0001"
TEAMS_ID = "00000000-0000-4000-8000-0000000000aa"
TEAMS_PASSWORD = "teams~client-secret-for-tests"
LARK_SECRET = "lark-app-secret-for-tests-0001"
# the platforms beyond the first three, as `config check` shows them with no credentials
OFF = {"email": "off: platforms.email.imap_host is not set", "webhook": "off: platforms.webhook.hooks is empty",
       "matrix": "off: platforms.matrix.access_token is not set (or a password with user_id)",
       "whatsapp": "off: platforms.whatsapp.access_token is not set", "signal": "off: platforms.signal.account is not set",
       "teams": "off: platforms.teams.app_id is not set", "lark": "off: platforms.lark.app_id is not set"}
NAMES = ", ".join(installed_platforms())

WA_TOKEN = "EAAGtest-whatsapp-access-token"
WA_SECRET = "whatsapp-app-secret-for-tests"
WA_VERIFY = "whatsapp-verify-token-for-tests"
FULL_ENV = {
    "TELEGRAM_BOT_TOKEN": TG_TOKEN,
    "TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "DISCORD_BOT_TOKEN": DISCORD_TOKEN,
    "SLACK_BOT_TOKEN": SLACK_BOT,
    "SLACK_APP_TOKEN": SLACK_APP,
    "WHATSAPP_ACCESS_TOKEN": WA_TOKEN,
    "WHATSAPP_PHONE_NUMBER_ID": "106540352242922",
    "WHATSAPP_APP_SECRET": WA_SECRET,
    "WHATSAPP_VERIFY_TOKEN": WA_VERIFY,
    "SIGNAL_ACCOUNT": "+4915112345678",
    "TEAMS_APP_ID": TEAMS_ID,
    "TEAMS_APP_PASSWORD": TEAMS_PASSWORD,
    "LARK_APP_ID": "cli_a1b2c3d4e5f60001",
    "LARK_APP_SECRET": LARK_SECRET,
    "SWITCHBOARD_MODEL_KEY": MODEL_KEY,
    "SWITCHBOARD_API_TOKEN": API_TOKEN,
    "EMAIL_IMAP_HOST": "imap.example.com",
    "EMAIL_USERNAME": "bot@example.com",
    "EMAIL_PASSWORD": EMAIL_PASSWORD,
    "EMAIL_SMTP_HOST": "smtp.example.com",
    "MATRIX_ACCESS_TOKEN": MATRIX_TOKEN,
}
ALL_SECRETS = [TG_TOKEN, DISCORD_TOKEN, SLACK_BOT, SLACK_APP, MODEL_KEY, API_TOKEN, WEBHOOK_SECRET, EMAIL_PASSWORD, MATRIX_TOKEN,
               WA_TOKEN, WA_SECRET, WA_VERIFY,
               TEAMS_PASSWORD, LARK_SECRET]


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def cli(*args: str, env: dict[str, str] | None = None):
    # An empty, explicit environment: nothing from the developer's shell leaks in.
    clean = {k: None for k in ("SWITCHBOARD_CONFIG", "SWITCHBOARD_HOME", *FULL_ENV)}
    return CliRunner().invoke(config_group, list(args), env={**clean, **(env or {})})


# --------------------------------------------------------------------------- the example file


def test_example_loads_with_no_environment_and_every_platform_off():
    cfg = load_config(EXAMPLE, env={})
    assert cfg.enabled_platforms() == {
        "telegram": "off: platforms.telegram.token is not set",
        "discord": "off: platforms.discord.token is not set",
        "slack": "off: platforms.slack.bot_token is not set",
        **OFF,
    }
    assert cfg.home == Path("~/.switchboard").expanduser()
    assert cfg.agent == "main"
    assert cfg.timezone == "UTC"
    assert cfg.api.host == "127.0.0.1" and cfg.api.port == 8642
    assert cfg.sessions.reset.mode == "both"
    assert cfg.source == EXAMPLE
    assert cfg.model.persona_text().startswith("You are a helpful assistant")


def test_example_documents_every_key_it_sets_with_a_comment():
    # Every mapping key in the example has a comment on the line above it or on its own line.
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        above = lines[i - 1].strip() if i else ""
        if "#" not in line and not above.startswith("#") and not _documented_in_block(lines, i):
            undocumented.append(stripped)
    assert undocumented == []


def _documented_in_block(lines: list[str], i: int) -> bool:
    # Per-platform common keys are documented once in the comment block under `platforms:`.
    key = lines[i].strip().split(":")[0]
    header = "\n".join(lines[: i])
    return f"#   {key}" in header


def test_example_with_tokens_in_the_environment_turns_platforms_on():
    cfg = load_config(EXAMPLE, env=FULL_ENV)
    assert cfg.enabled_platforms() == {**{name: "on" for name in installed_platforms()},
                                       "webhook": "off: platforms.webhook.hooks is empty"}
    assert cfg.platforms.telegram.token == TG_TOKEN
    assert sorted(cfg.secrets()) == sorted(ALL_SECRETS)


def test_every_key_of_the_contract_is_in_the_example():
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    assert set(data) == set(Config.model_fields)
    for section in ("model", "sessions", "auth", "api", "logging", "shutdown", "compression", "recall", "cron", "store"):
        model_fields = set(type(getattr(Config(), section)).model_fields)
        assert set(data[section]) <= model_fields
    for name in installed_platforms():
        documented = set(data["platforms"][name]) | {"enabled"}
        assert documented == set(type(getattr(Config().platforms, name)).model_fields), name


# --------------------------------------------------------------------------- defaults and shapes


def test_defaults_from_an_empty_file(tmp_path):
    cfg = load_config(write(tmp_path, ""), env={"SWITCHBOARD_HOME": str(tmp_path / "h")})
    assert cfg.home == tmp_path / "h"
    assert cfg.db_path == tmp_path / "h" / "state.db"
    assert (cfg.agent, cfg.timezone) == ("main", "UTC")
    assert cfg.sessions.group_sessions_per_user is True
    assert cfg.sessions.thread_sessions_per_user is False
    assert (cfg.sessions.reset.mode, cfg.sessions.reset.idle_minutes, cfg.sessions.reset.at_hour) == ("both", 1440, 4)
    assert (cfg.auth.allow_all, cfg.auth.unauthorized_dm, cfg.auth.owner) == (False, "pair", None)
    assert cfg.platforms.telegram.require_mention is True
    assert (cfg.api.host, cfg.api.port, cfg.api.token) == ("127.0.0.1", 8642, "")
    assert (cfg.logging.level, cfg.logging.format) == ("INFO", "auto")
    assert cfg.shutdown.grace_seconds == 30
    assert (cfg.compression.threshold, cfg.compression.enabled) == (0.75, True)
    assert cfg.store.write_timeout_seconds == 10
    assert cfg.cron.jobs == ()


def test_home_defaults_to_dot_switchboard_and_relative_paths_follow_the_file(tmp_path):
    assert load_config(write(tmp_path, ""), env={}).home == Path("~/.switchboard").expanduser()
    (tmp_path / "persona.md").write_text("Be brief.", encoding="utf-8")
    cfg = load_config(write(tmp_path, "home: state\nmodel:\n  persona_file: persona.md\n"), env={})
    assert cfg.home == tmp_path / "state"
    assert cfg.model.persona_text() == "Be brief."


def test_a_blank_value_means_the_default(tmp_path):
    text = "sessions:\n  # everything commented out\nauth:\n  allowed_users:\ntimezone:\nplatforms:\n  telegram:\n    token:\n"
    cfg = load_config(write(tmp_path, text), env={})
    assert cfg.sessions.reset.mode == "both"
    assert cfg.auth.allowed_users == ()
    assert cfg.timezone == "UTC"
    assert cfg.enabled_platforms()["telegram"] == "off: platforms.telegram.token is not set"


def test_config_is_frozen_and_lists_are_tuples(tmp_path):
    cfg = load_config(
        write(tmp_path, "auth:\n  allowed_users: [telegram:1]\nidentities:\n  alice: [telegram:1, slack:U1]\n"), env={}
    )
    with pytest.raises(ValidationError):
        cfg.agent = "other"
    with pytest.raises(ValidationError):
        cfg.platforms.telegram.token = "x"
    assert cfg.auth.allowed_users == ("telegram:1",)
    assert isinstance(cfg.identities, MappingProxyType)
    assert cfg.identities["alice"] == ("telegram:1", "slack:U1")
    with pytest.raises(TypeError):
        cfg.identities["bob"] = ("telegram:2",)


def test_numeric_ids_and_platform_allowed_users(tmp_path):
    text = """
auth:
  allowed_users: [telegram:111, "Discord:222"]
platforms:
  telegram:
    allowed_users: [333, "telegram:444"]
    free_response_channels: [-100123]
"""
    cfg = load_config(write(tmp_path, text), env={})
    assert cfg.auth.allowed_users == ("telegram:111", "discord:222")
    assert cfg.platforms.telegram.allowed_users == ("333", "444")
    assert cfg.platforms.telegram.free_response_channels == ("-100123",)
    assert cfg.allowed_user_ids("telegram") == {"111", "333", "444"}
    assert cfg.allowed_user_ids("discord") == {"222"}
    assert cfg.allowed_user_ids("slack") == frozenset()


def test_a_disabled_platform_with_a_token_is_off(tmp_path):
    cfg = load_config(write(tmp_path, f"platforms:\n  discord:\n    token: {DISCORD_TOKEN}\n    enabled: false\n"), env={})
    assert cfg.enabled_platforms()["discord"] == "off: platforms.discord.enabled is false"


def test_slack_http_mode_is_on_with_signing_secret(tmp_path):
    text = "platforms:\n  slack:\n    bot_token: xoxb-1\n    signing_secret: s3cret-signing\n    mode: http\n"
    assert load_config(write(tmp_path, text), env={}).enabled_platforms()["slack"] == "on"


def test_api_may_listen_beyond_loopback_with_a_token(tmp_path):
    cfg = load_config(write(tmp_path, "api:\n  host: 0.0.0.0\n  token: abcdefgh\n"), env={})
    assert cfg.api.host == "0.0.0.0"
    for host in ("localhost", "::1", "127.0.0.2"):
        assert load_config(write(tmp_path, f'api:\n  host: "{host}"\n'), env={}).api.host == host


def test_cron_jobs_stay_loosely_typed(tmp_path):
    text = """
cron:
  jobs:
    - id: morning
      schedule: "0 8 * * *"
      prompt: Good morning
      deliver: {platform: telegram, chat_id: 5}
      something_new: kept
"""
    (job,) = load_config(write(tmp_path, text), env={}).cron.jobs
    assert (job.id, job.schedule, job.prompt) == ("morning", "0 8 * * *", "Good morning")
    assert job.deliver == {"platform": "telegram", "chat_id": 5}
    assert job.model_extra == {"something_new": "kept"}


def test_config_from_dict_raises_the_same_errors_without_a_file():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"sessions": {"reset": {"mode": "sometimes"}}}, env={})
    assert str(info.value) == 'sessions.reset.mode: must be one of idle, daily, both, none (got "sometimes")'
    assert info.value.key == "sessions.reset.mode" and info.value.file is None


# --------------------------------------------------------------------------- reset policy precedence


def test_reset_policy_precedence_is_type_over_platform_over_global(tmp_path):
    text = """
sessions:
  reset:
    mode: both
    idle_minutes: 600
    at_hour: 4
    by_platform:
      discord: {idle_minutes: 60, at_hour: 6}
    by_type:
      dm: {mode: daily}
      group: {idle_minutes: 30}
"""
    s = load_config(write(tmp_path, text), env={}).sessions
    assert s.reset_policy_for("telegram", "thread") == ResetPolicy("both", 600, 4)
    assert s.reset_policy_for("discord", "thread") == ResetPolicy("both", 60, 6)
    assert s.reset_policy_for("discord", "dm") == ResetPolicy("daily", 60, 6)
    assert s.reset_policy_for("discord", "group") == ResetPolicy("both", 30, 6)
    assert s.reset_policy_for("telegram", "group") == ResetPolicy("both", 30, 4)
    assert s.reset_policy_for("matrix", "unknown") == ResetPolicy("both", 600, 4)
    from gateway.types import ChatType

    assert s.reset_policy_for("slack", ChatType.DM) == ResetPolicy("daily", 600, 4)
    assert s.reset_policy_for("slack", ChatType.DM).resets_daily is True
    assert s.reset_policy_for("slack", ChatType.DM).resets_when_idle is False


# --------------------------------------------------------------------------- ${VAR}


def test_env_expansion_with_and_without_defaults(tmp_path):
    text = """
agent: ${AGENT}
timezone: ${TZ_NAME:-Europe/Berlin}
model:
  name: ${MODEL_NAME:-fallback}
  base_url: http://${MODEL_HOST:-127.0.0.1}:${MODEL_PORT:-8000}/v1
api:
  port: ${API_PORT:-8642}
auth:
  allowed_users: ["telegram:${OWNER_ID}"]
platforms:
  telegram:
    token: ${TELEGRAM_BOT_TOKEN}
    base_url: "https://example.invalid/$${literal}/bot"
"""
    env = {"AGENT": "helper", "MODEL_NAME": "", "MODEL_PORT": "9000", "API_PORT": "9999", "OWNER_ID": "42", "TELEGRAM_BOT_TOKEN": ""}
    cfg = load_config(write(tmp_path, text), env=env)
    assert cfg.agent == "helper"
    assert cfg.timezone == "Europe/Berlin"  # unset -> default
    assert cfg.model.name == "fallback"  # empty -> default, as in the shell
    assert cfg.model.base_url == "http://127.0.0.1:9000/v1"
    assert cfg.api.port == 9999
    assert cfg.auth.allowed_users == ("telegram:42",)
    assert cfg.platforms.telegram.token == ""  # ${VAR} set but empty is empty: platform off
    assert cfg.platforms.telegram.base_url == "https://example.invalid/${literal}/bot"


def test_env_values_cannot_change_the_structure(tmp_path):
    cfg = load_config(write(tmp_path, "model:\n  name: ${A}\n"), env={"A": "x\nsessions: 5"})
    assert cfg.model.name == "x\nsessions: 5"
    assert cfg.sessions.reset.mode == "both"


# --------------------------------------------------------------------------- finding the file


def test_find_config_path_precedence(tmp_path, monkeypatch):
    env = {"SWITCHBOARD_CONFIG": str(tmp_path / "a.yaml"), "SWITCHBOARD_HOME": str(tmp_path / "home")}
    assert find_config_path("given.yaml", env) == Path("given.yaml")
    assert find_config_path(None, env) == tmp_path / "a.yaml"
    assert find_config_path(None, {"SWITCHBOARD_HOME": str(tmp_path / "home")}) == tmp_path / "home" / "config.yaml"
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    # nothing set and no ~/.switchboard/config.yaml: the checkout's example, which `make run` uses
    assert find_config_path(None, {}) == EXAMPLE.resolve()
    (tmp_path / "user" / ".switchboard").mkdir(parents=True)
    (tmp_path / "user" / ".switchboard" / "config.yaml").write_text("agent: mine\n")
    assert find_config_path(None, {}) == tmp_path / "user" / ".switchboard" / "config.yaml"


def test_load_config_uses_switchboard_home(tmp_path):
    (tmp_path / "config.yaml").write_text("agent: from-home\n", encoding="utf-8")
    cfg = load_config(env={"SWITCHBOARD_HOME": str(tmp_path)})
    assert cfg.agent == "from-home" and cfg.home == tmp_path


# --------------------------------------------------------------------------- mistakes: exit 78, one line

MISTAKES = [
    # (name, file text, env, expected key path, fragment of the message)
    ("yaml syntax", "model:\n  name: x\n   bad: [\n", {}, None, "YAML syntax error at line 3, column 7"),
    ("duplicate key", "agent: a\nagent: b\n", {}, None, 'line 2, column 1: duplicate key "agent" (first set on line 1)'),
    ("not a mapping", "- a\n- b\n", {}, None, "must be a mapping of keys at the top level (got a list)"),
    ("unknown key", "platforms:\n  telgram: {}\n", {}, "platforms.telgram",
     'unknown key "telgram" (did you mean "telegram"?); valid keys here: ' + NAMES),
    ("platform not installed", "platforms:\n  xmpp: {}\n", {}, "platforms.xmpp",
     'unknown key "xmpp"; valid keys here: ' + NAMES + ' (these are the installed platforms; '
     "a platform's settings come with its adapter package)"),
    ("unknown platform key", "platforms:\n  discord:\n    tokn: x\n", {}, "platforms.discord.tokn",
     'unknown key "tokn" (did you mean "token"?); valid keys here: enabled, allowed_users'),
    ("unknown top-level key", "sesions: {}\n", {}, "sesions", 'did you mean "sessions"?'),
    ("wrong type", "model:\n  context_length: lots\n", {}, "model.context_length", 'must be a whole number (got "lots")'),
    ("section not a mapping", "sessions: 5\n", {}, "sessions", "must be a mapping of keys (got 5)"),
    ("not a list", "auth:\n  allowed_users: telegram:1\n", {}, "auth.allowed_users", 'must be a list (got "telegram:1")'),
    ("bad bool", "auth:\n  allow_all: maybe\n", {}, "auth.allow_all", 'must be true or false (got "maybe")'),
    ("bad enum", "sessions:\n  reset:\n    mode: sometimes\n", {}, "sessions.reset.mode",
     'must be one of idle, daily, both, none (got "sometimes")'),
    ("bad override enum", "sessions:\n  reset:\n    by_type:\n      dm: {mode: nope}\n", {}, "sessions.reset.by_type.dm.mode",
     "must be one of idle, daily, both, none"),
    ("bad timezone", "timezone: Mars/Base\n", {}, "timezone", 'unknown timezone "Mars/Base"; use an IANA name'),
    ("bad user ref", "auth:\n  allowed_users: [telegram123]\n", {}, "auth.allowed_users[0]",
     'must be platform:user_id with platform one of ' + NAMES),
    ("bad identity ref", "identities:\n  alice: [irc:bob]\n", {}, "identities.alice[0]", "must be platform:user_id"),
    ("wrong platform id", "platforms:\n  discord:\n    allowed_users: ['telegram:1']\n", {},
     "platforms.discord.allowed_users[0]", "must be a discord user id"),
    ("out of range", "sessions:\n  reset:\n    at_hour: 25\n", {}, "sessions.reset.at_hour", "must be at most 23 (got 25)"),
    ("below range", "model:\n  max_concurrent_calls: 0\n", {}, "model.max_concurrent_calls", "must be at least 1 (got 0)"),
    ("threshold range", "compression:\n  threshold: 1.5\n", {}, "compression.threshold", "must be at most 1 (got 1.5)"),
    ("message share range", "model:\n  max_message_share: 0\n", {}, "model.max_message_share",
     "must be at least 0.05 (got 0)"),
    ("unset variable", "platforms:\n  telegram:\n    token: ${NOPE_TOKEN}\n", {}, "platforms.telegram.token",
     "environment variable NOPE_TOKEN is not set"),
    ("malformed variable", "agent: '${1X}'\n", {}, "agent", 'malformed "${1X}"'),
    ("slack half configured", "platforms:\n  slack:\n    bot_token: xoxb-1\n", {}, "platforms.slack.app_token",
     "is not set but bot_token is; socket mode needs"),
    ("slack http half configured", "platforms:\n  slack:\n    bot_token: xoxb-1\n    mode: http\n", {},
     "platforms.slack.signing_secret", "http mode needs"),
    ("slack without bot token", "platforms:\n  slack:\n    app_token: xapp-1\n", {}, "platforms.slack.bot_token", "is not set"),
    ("telegram webhook without token", "platforms:\n  telegram:\n    webhook_url: https://example.org/hook\n", {},
     "platforms.telegram.token", "is not set but webhook settings are"),
    ("open api without token", "api:\n  host: 0.0.0.0\n", {}, "api.token", "must be set when api.host is 0.0.0.0"),
    ("owner unknown", "auth:\n  owner: bob\n", {}, "auth.owner", "'bob' is not a name under identities"),
    ("account in two identities", "identities:\n  a: [telegram:1]\n  b: [telegram:1]\n", {}, "identities.b[0]",
     "already listed under identity 'a'"),
    ("bad url", "model:\n  base_url: localhost:8000\n", {}, "model.base_url", "must be a URL starting with http:// or https://"),
    ("persona twice", "model:\n  persona: hi\n  persona_file: config.yaml\n", {}, "model.persona_file", "not both"),
    ("bad log level", "logging:\n  level: verbose\n", {}, "logging.level", "must be one of DEBUG, INFO"),
    ("retention below a day", "store:\n  retention_days: 0.5\n", {}, "store.retention_days", "must be at least 1 (got 0.5)"),
    ("bad reasoning replay", "model:\n  replay_reasoning: sometimes\n", {}, "model.replay_reasoning",
     'must be one of tool_loop, always, never (got "sometimes")'),
    ("unknown cron model", "models:\n  fast: {base_url: 'http://127.0.0.1:9/v1', name: f}\ncron:\n  jobs:\n"
     "  - {id: a, schedule: every 1h, prompt: hi, model: gpt-4o}\n", {}, "cron.jobs[0].model",
     "'gpt-4o' is not a model name; use one of default, fast"),
    ("bad allowed_for", "models:\n  fast: {base_url: 'http://127.0.0.1:9/v1', name: f, allowed_for: [ann]}\n", {},
     "models.fast.allowed_for[0]", "must be platform:user_id"),
]


@pytest.mark.parametrize("name,text,env,key,fragment", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_exits_78_with_one_line_naming_file_and_key(tmp_path, name, text, env, key, fragment):
    path = write(tmp_path, text)
    result = cli("check", "--config", str(path), env=env)
    assert result.exit_code == 78, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    prefix = f"error: {path}: " + (f"{key}: " if key else "")
    assert lines[0].startswith(prefix), lines[0]
    assert fragment in lines[0]


def test_a_missing_file_says_where_it_looked(tmp_path):
    result = cli("check", "--config", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 78
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'nope.yaml'}: no config file at {tmp_path / 'nope.yaml'} (given with --config); "
        "pass --config FILE, set SWITCHBOARD_CONFIG, or copy config.example.yaml there"
    )
    result = cli("check", env={"SWITCHBOARD_HOME": str(tmp_path / "home")})
    assert result.exit_code == 78
    assert f"no config file at {tmp_path / 'home' / 'config.yaml'} (looked in $SWITCHBOARD_HOME)" in result.stderr


def test_several_mistakes_are_named_on_the_same_line(tmp_path):
    path = write(tmp_path, "sessions:\n  reset:\n    mode: x\n    at_hour: 99\n")
    result = cli("check", "--config", str(path))
    assert result.exit_code == 78
    assert result.stderr.splitlines() == [
        f'error: {path}: sessions.reset.mode: must be one of idle, daily, both, none (got "x") (also wrong: sessions.reset.at_hour)'
    ]


def test_a_bad_secret_is_never_echoed(tmp_path):
    path = write(tmp_path, "platforms:\n  telegram:\n    token: '123:abc'\n    webhook_secret: 'sup3r secret!'\n")
    result = cli("check", "--config", str(path))
    assert result.exit_code == 78
    assert "platforms.telegram.webhook_secret: must be 1-256 characters" in result.stderr
    assert "sup3r" not in result.stderr
    path = write(tmp_path, "platforms:\n  slack:\n    bot_token: [xoxb-secret-in-a-list]\n")
    result = cli("check", "--config", str(path))
    assert result.exit_code == 78
    assert "platforms.slack.bot_token: must be a single text value (got a value hidden because it is a secret)" in result.stderr
    assert "xoxb-secret" not in result.stderr


def test_the_example_names_features_not_internal_documents():
    text = EXAMPLE.read_text(encoding="utf-8")
    assert re.findall(r"\b(?:seed|issue) \d+", text, flags=re.IGNORECASE) == []


# --------------------------------------------------------------------------- each platform's own model


def test_each_platform_section_is_validated_by_the_model_beside_its_adapter():
    assert dict(platform_models()) == {"telegram": TelegramConfig, "discord": DiscordConfig, "slack": SlackConfig,
                                       "email": EmailConfig, "webhook": WebhookConfig,
                                       "matrix": MatrixConfig, "whatsapp": WhatsAppConfig, "signal": SignalConfig,
                                       "teams": TeamsConfig, "lark": LarkConfig}
    cfg = load_config(EXAMPLE, env=FULL_ENV)
    assert type(cfg.platforms.telegram) is TelegramConfig
    assert type(cfg.platforms.discord) is DiscordConfig
    assert type(cfg.platforms.slack) is SlackConfig
    assert type(Config().platforms.slack) is SlackConfig


def test_every_installed_adapter_publishes_its_settings_model():
    # Without one, platforms.<name> would be an unknown key and the daemon would never start that adapter.
    adapters = {ep.name for ep in entry_points(group="switchboard.adapters")}
    assert adapters == set(platform_models())


def test_loading_the_config_does_not_load_the_platform_libraries():
    # `switchboard config check` and every CLI command stay quick: the settings models are light.
    code = ("import sys; from gateway.config import load_config; "
            f"cfg = load_config({str(EXAMPLE)!r}, env={{}}); "
            "print(sorted(m for m in ('telegram', 'discord', 'slack_bolt', 'slack_sdk') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


XMPP_CONFIG = """
from typing import ClassVar

from gateway.config import HttpUrl, PlatformConfig, secret_field


class XmppConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "xmpp"
    homeserver: HttpUrl = "https://xmpp.example.org"
    access_token: str = secret_field()

    def credential_problem(self):
        return None if self.access_token else "platforms.xmpp.access_token is not set"
"""


def _install_platform(site: Path, monkeypatch, name: str, config_module: str) -> None:
    """A platform package from outside this repository, installed beside it: its own settings model,
    published under the switchboard.adapter_configs entry point."""
    package = site / f"switchboard_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "config.py").write_text(config_module, encoding="utf-8")
    dist = site / f"switchboard_{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: switchboard-{name}\nVersion: 1.0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        f"[switchboard.adapter_configs]\n{name} = switchboard_{name}.config:{name.title()}Config\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    platform_models.cache_clear()
    installed_platforms.cache_clear()


@pytest.fixture
def site(tmp_path):
    yield tmp_path / "site"
    platform_models.cache_clear()
    installed_platforms.cache_clear()
    for name in [m for m in sys.modules if m.startswith("switchboard_")]:
        del sys.modules[name]


@pytest.fixture
def xmpp_installed(site, monkeypatch):
    _install_platform(site, monkeypatch, "xmpp", XMPP_CONFIG)


def test_a_broken_platform_package_is_named_with_exit_78(tmp_path, site, monkeypatch):
    _install_platform(site, monkeypatch, "broken", "import nio_not_installed_here\n")
    result = cli("check", "--config", str(write(tmp_path, "")))
    assert result.exit_code == 78
    assert result.stderr.splitlines() == [
        "error: platforms.broken: the settings model of the installed platform broken (switchboard_broken.config:BrokenConfig) "
        "cannot be loaded (ModuleNotFoundError: No module named 'nio_not_installed_here'); "
        "reinstall or uninstall the package that provides it"
    ]


def test_an_installed_platform_brings_its_own_settings(tmp_path, xmpp_installed):
    assert list(platform_models()) == [*BUILT_IN, "xmpp"]
    path = write(tmp_path, "platforms:\n  xmpp:\n    homeserver: xmpp.example.org\n")
    result = cli("check", "--config", str(path))
    assert result.exit_code == 78
    assert result.stderr.splitlines() == [
        f"error: {path}: platforms.xmpp.homeserver: must be a URL starting with http:// or https:// "
        '(got "xmpp.example.org")'
    ]

    token = "xmpp_secret_token_0001"
    path = write(tmp_path, f"platforms:\n  xmpp:\n    homeserver: https://m.example.org\n    access_token: {token}\n")
    cfg = load_config(path, env={})
    assert cfg.platforms.xmpp.homeserver == "https://m.example.org"
    assert cfg.enabled_platforms()["xmpp"] == "on"
    assert load_config(write(tmp_path, "", "empty.yaml"), env={}).enabled_platforms()["xmpp"] == (
        "off: platforms.xmpp.access_token is not set")
    result = cli("show", "--json", "--config", str(path))
    assert result.exit_code == 0, result.output
    assert token not in result.stdout
    assert json.loads(result.stdout)["platforms"]["xmpp"] == {
        "enabled": True, "allowed_users": [], "require_mention": True, "free_response_channels": [],
        "stall_timeout_seconds": 120.0, "homeserver": "https://m.example.org", "access_token": "***",
        "streaming": {"enabled": None, "edit_interval_seconds": None},
    }


# --------------------------------------------------------------------------- check and show


def test_check_reports_platform_states(tmp_path):
    result = cli("check", "--config", str(EXAMPLE), env={"TELEGRAM_BOT_TOKEN": TG_TOKEN, "SWITCHBOARD_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{EXAMPLE}: ok",
        "  telegram: on",
        "  discord: off: platforms.discord.token is not set",
        "  slack: off: platforms.slack.bot_token is not set",
        *(f"  {name}: {why}" for name, why in OFF.items()),
        f"  api: http://127.0.0.1:8642  home: {tmp_path}",
        "  warning: context length of model 'default' is unknown; assuming 8,192 tokens, so long conversations "
        "are compressed early. Set model.context_length in the config to the model's real window",
    ]


def test_check_json_has_one_shape(tmp_path):
    result = cli("check", "--json", "--config", str(EXAMPLE),
                 env={"TELEGRAM_BOT_TOKEN": TG_TOKEN, "SWITCHBOARD_HOME": str(tmp_path), "SWITCHBOARD_MODEL": "gpt-4o"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "ok": True, "file": str(EXAMPLE), "home": str(tmp_path), "api": "http://127.0.0.1:8642",
        "platforms": {"telegram": "on", "discord": "off: platforms.discord.token is not set",
                      "slack": "off: platforms.slack.bot_token is not set", **OFF},
        "warnings": [],
    }
    bad = write(tmp_path, "sessions:\n  reset:\n    mode: x\n")
    result = cli("check", "--json", "--config", str(bad))
    assert result.exit_code == 78
    data = json.loads(result.stdout)
    assert data["ok"] is False and "sessions.reset.mode: must be one of" in data["error"]


def test_check_finds_the_file_through_switchboard_config(tmp_path):
    result = cli("check", env={"SWITCHBOARD_CONFIG": str(EXAMPLE)})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{EXAMPLE}: ok")


@pytest.mark.parametrize("as_json", [False, True])
def test_show_prints_the_effective_config_with_secrets_redacted(as_json):
    args = ["show", "--config", str(EXAMPLE)] + (["--json"] if as_json else [])
    result = cli(*args, env=FULL_ENV)
    assert result.exit_code == 0, result.output
    for secret in ALL_SECRETS:
        assert secret not in result.stdout
    data = json.loads(result.stdout) if as_json else yaml.safe_load(result.stdout)
    assert data["platforms"]["telegram"]["token"] == "***"
    assert data["platforms"]["telegram"]["webhook_secret"] == "***"
    assert data["platforms"]["discord"]["token"] == "***"
    assert data["platforms"]["slack"]["bot_token"] == "***"
    assert data["platforms"]["slack"]["app_token"] == "***"
    assert data["platforms"]["matrix"]["access_token"] == "***"
    assert data["platforms"]["slack"]["signing_secret"] == ""  # unset stays visibly unset
    assert data["model"]["api_key"] == "***"
    assert data["api"]["token"] == "***"
    assert data["sessions"]["reset"] == {
        "mode": "both",
        "idle_minutes": 1440,
        "at_hour": 4,
        "by_platform": {name: None for name in installed_platforms()},
        "by_type": {"dm": None, "group": None, "thread": None, "channel": None},
    }


def test_show_output_validates_again_once_secrets_are_put_back(tmp_path):
    shown = yaml.safe_load(cli("show", "--config", str(EXAMPLE)).stdout)
    assert load_config(write(tmp_path, yaml.safe_dump(shown)), env={}).redacted() == shown


def test_repr_hides_secrets():
    cfg = load_config(EXAMPLE, env=FULL_ENV)
    for secret in ALL_SECRETS:
        assert secret not in repr(cfg)
        assert secret not in str(cfg)


def test_every_command_has_help():
    for name in ("check", "show"):
        result = cli(name, "--help")
        assert result.exit_code == 0 and "--config" in result.stdout


def test_streaming_follows_the_platform_then_the_streaming_section_then_the_platforms_own_pace():
    cfg = config_from_dict({"platforms": {"telegram": {"token": "1:x"}, "discord": {"token": "d"},
                                          "slack": {"streaming": {"enabled": False}}}})
    assert cfg.streaming.for_platform(cfg.platforms.telegram) == (True, 1.0)
    assert cfg.streaming.for_platform(cfg.platforms.discord) == (True, 1.2), "Discord's own pace"
    assert cfg.streaming.for_platform(cfg.platforms.slack)[0] is False
    cfg = config_from_dict({"streaming": {"edit_interval_seconds": 2},
                            "platforms": {"discord": {"streaming": {"edit_interval_seconds": 1.5}}}})
    assert cfg.streaming.for_platform(cfg.platforms.telegram) == (True, 2.0)
    assert cfg.streaming.for_platform(cfg.platforms.discord) == (True, 1.5)


def test_an_edit_interval_below_a_quarter_second_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"platforms\.telegram\.streaming\.edit_interval_seconds"):
        config_from_dict({"platforms": {"telegram": {"streaming": {"edit_interval_seconds": 0.1}}}})


def test_the_cluster_section_has_defaults_and_an_instance_id_per_process():
    first, second = config_from_dict({}, env={}), config_from_dict({}, env={})
    assert (first.cluster.failover_seconds, first.cluster.lease_seconds) == (10.0, 15.0)
    assert re.fullmatch(rf"{re.escape(socket.gethostname())}-{os.getpid()}-[0-9a-f]{{6}}", first.cluster.instance_id)
    assert first.cluster.instance_id == second.cluster.instance_id  # a reload keeps it
    assert not first.clustered  # SQLite: one instance, no cluster
    assert config_from_dict({"store": {"url": "postgresql://u@h/db"}, "cluster": {"instance_id": "a-1"}},
                            env={}).cluster.instance_id == "a-1"


@pytest.mark.parametrize("section, key", [({"failover_seconds": 2}, "cluster.failover_seconds"),
                                          ({"lease_seconds": 0}, "cluster.lease_seconds"),
                                          ({"instance_id": "two words"}, "cluster.instance_id"),
                                          ({"failover": 10}, "cluster.failover")])
def test_a_bad_cluster_value_names_its_key(section, key):
    with pytest.raises(ConfigError) as info:
        config_from_dict({"cluster": section}, env={})
    assert info.value.key == key, str(info.value)


def test_an_error_about_a_value_from_the_environment_names_the_variable(tmp_path):
    example = Path(__file__).resolve().parent.parent / "config.example.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(example, env={"SWITCHBOARD_CONTEXT_LENGTH": "128k", "SWITCHBOARD_HOME": str(tmp_path)})
    assert str(caught.value).endswith('model.context_length: must be a whole number (got "128k"); '
                                      "set by SWITCHBOARD_CONTEXT_LENGTH=128k in the environment")
    cfg = load_config(example, env={"TELEGRAM_BOT_TOKEN": "123:abc", "SWITCHBOARD_HOME": str(tmp_path)})
    assert cfg.named("platforms.telegram.token") == "TELEGRAM_BOT_TOKEN (platforms.telegram.token)"
    assert cfg.named("model.name") == "model.name"  # the default stood in: no variable set it
