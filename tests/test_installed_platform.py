"""A platform installed as its own package is named wherever a built-in one is.

The "echo" platform below lives outside this repository: a tiny package with a ``*.dist-info`` whose
entry points publish its settings model (``switchboard.adapter_configs``) and its adapter
(``switchboard.adapters``), put on ``sys.path`` here and on ``PYTHONPATH`` for the CLI and the daemon.
Its adapter "receives" the JSON lines of ``platforms.echo.inbox`` once connected and writes each reply
as a JSON line to ``platforms.echo.outbox``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from click.testing import CliRunner

import state
from gateway.cli.config import config_group
from gateway.config import ResetPolicy, config_from_dict, platform_models
from gateway.cron.schedule import parse_target
from gateway.cron.service import config_jobs
from gateway.errors import ConfigError
from gateway.platforms import BUILT_IN, installed_platforms
from gateway.runtime.daemon import auth_settings
from tests.crashkit import SWITCHBOARD, NotifySocket, start_daemon
from tests.fakes.model_server import FakeModel

FORMS = {"webhook": "webhook:<hook>[:<conversation>]"}  # the cron targets not written <platform>:<chat_id>
SHIPPED = ", ".join(BUILT_IN)  # the platforms that come with Switchboard, as the messages list them
# the platforms beyond the first three, as the daemon names them with no credentials
OFF = {"email": "off: platforms.email.imap_host is not set", "webhook": "off: platforms.webhook.hooks is empty",
       "matrix": "off: platforms.matrix.access_token is not set (or a password with user_id)",
       "whatsapp": "off: platforms.whatsapp.access_token is not set", "signal": "off: platforms.signal.account is not set",
       "teams": "off: platforms.teams.app_id is not set", "lark": "off: platforms.lark.app_id is not set"}

ECHO_CONFIG = '''
from typing import ClassVar

from gateway.config import PlatformConfig


class EchoConfig(PlatformConfig):
    PLATFORM: ClassVar[str] = "echo"
    inbox: str = ""  # a JSON-lines file: the messages this platform receives once connected
    outbox: str = ""  # where its replies go, one JSON line each

    def credential_problem(self):
        return None if self.inbox else "platforms.echo.inbox is not set"
'''

ECHO_ADAPTER = '''
import asyncio
import json
from pathlib import Path

from gateway.types import AdapterHealth, ChatType, Delivery, InboundMessage


class EchoAdapter:
    platform = "echo"

    def __init__(self, inbox, outbox):
        self.inbox, self.outbox = Path(inbox), Path(outbox)
        self.state = "stopped"
        self.sent = 0
        self._delivering = None

    @classmethod
    def from_config(cls, cfg, *, commands, vision, media=None):
        return cls(cfg.inbox, cfg.outbox)

    async def start(self, handler, *, dead_letter=None):
        self.state = "connected"
        lines = (await asyncio.to_thread(self.inbox.read_text)).splitlines()
        self._delivering = asyncio.create_task(self._deliver(handler, [json.loads(line) for line in lines if line]))

    async def _deliver(self, handler, messages):
        for m in messages:
            await handler(InboundMessage(platform="echo", chat_type=ChatType.DM, chat_id=m["user"],
                                         user_id=m["user"], text=m["text"], message_id=m["id"]))

    async def send(self, chat, text, *, reply_to=None, progress=None):
        self.sent += 1
        line = json.dumps({"chat": chat.chat_id, "text": text}) + "\\n"
        await asyncio.to_thread(self._append, line)
        return Delivery(ok=True, message_ids=(str(self.sent),))

    def _append(self, line):
        with self.outbox.open("a", encoding="utf-8") as f:
            f.write(line)

    async def send_typing(self, chat):
        pass

    async def stop(self):
        self.state = "stopped"

    def health(self):
        return AdapterHealth("echo", state=self.state)
'''


def install_echo(site: Path) -> Path:
    """Write the echo platform package into ``site``, as pip would install it; returns ``site``."""
    package = site / "switchboard_echo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "config.py").write_text(ECHO_CONFIG, encoding="utf-8")
    (package / "adapter.py").write_text(ECHO_ADAPTER, encoding="utf-8")
    dist = site / "switchboard_echo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: switchboard-echo\nVersion: 1.0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(
        "[switchboard.adapters]\necho = switchboard_echo.adapter:EchoAdapter\n\n"
        "[switchboard.adapter_configs]\necho = switchboard_echo.config:EchoConfig\n", encoding="utf-8")
    return site


def _forget_installed() -> None:
    installed_platforms.cache_clear()
    platform_models.cache_clear()
    for name in [m for m in sys.modules if m.startswith("switchboard_echo")]:
        del sys.modules[name]


@pytest.fixture
def echo_site(tmp_path, monkeypatch):
    """The echo platform installed in this process (and, through :func:`with_echo`, in subprocesses)."""
    site = install_echo(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    _forget_installed()
    yield site
    _forget_installed()


def with_echo(site: Path) -> dict[str, str]:
    """The environment of a subprocess that has the echo platform installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return env


# --------------------------------------------------------------------------- the names


def test_the_installed_platforms_are_the_built_ins_then_the_others_by_name(echo_site):
    assert installed_platforms() == (*BUILT_IN, "echo")
    assert list(platform_models()) == [*BUILT_IN, "echo"]


def test_without_the_package_only_the_built_ins_are_installed():
    assert installed_platforms() == BUILT_IN
    with pytest.raises(ConfigError) as info:
        config_from_dict({"auth": {"allowed_users": ["echo:42"]}}, env={})
    assert info.value.key == "auth.allowed_users[0]"
    assert str(info.value).startswith(
        f'auth.allowed_users[0]: must be platform:user_id with platform one of {SHIPPED} '
        '(the installed ones), like "telegram:123456789" or "slack:U0123ABCD" (got "echo:42")')


# --------------------------------------------------------------------------- the config


def test_an_installed_platform_is_named_in_auth_identities_and_reset(echo_site):
    cfg = config_from_dict({
        "auth": {"allowed_users": ["echo:42", "Telegram:7"], "owner": "alice"},
        "identities": {"alice": ["echo:42", "telegram:7"]},
        "sessions": {"reset": {"idle_minutes": 600,
                               "by_platform": {"echo": {"mode": "idle", "idle_minutes": 5}, "slack": {"at_hour": 6}}}},
    }, env={})
    assert cfg.auth.allowed_users == ("echo:42", "telegram:7")
    assert cfg.identities == {"alice": ("echo:42", "telegram:7")}
    assert auth_settings(cfg).allowed_users == {"echo:42", "telegram:7"}
    assert cfg.sessions.reset_policy_for("echo", "dm") == ResetPolicy("idle", 5, 4)
    assert cfg.sessions.reset_policy_for("slack", "dm") == ResetPolicy("both", 600, 6)
    assert cfg.sessions.reset_policy_for("telegram", "dm") == ResetPolicy("both", 600, 4)
    assert cfg.redacted()["sessions"]["reset"]["by_platform"] == {
        **{name: None for name in BUILT_IN}, "slack": {"mode": None, "idle_minutes": None, "at_hour": 6},
        "echo": {"mode": "idle", "idle_minutes": 5, "at_hour": None}}
    assert cfg.enabled_platforms()["echo"] == "off: platforms.echo.inbox is not set"


UNKNOWN = [
    ("auth", {"auth": {"allowed_users": ["irc:42"]}}, "auth.allowed_users[0]",
     f'must be platform:user_id with platform one of {SHIPPED}, echo (the installed ones), '
     'like "telegram:123456789" or "slack:U0123ABCD" (got "irc:42")'),
    ("identity", {"identities": {"alice": ["echo:42", "irc:bob"]}}, "identities.alice[1]",
     f'must be platform:user_id with platform one of {SHIPPED}, echo (the installed ones), '
     'like "telegram:123456789" or "slack:U0123ABCD" (got "irc:bob")'),
    ("reset", {"sessions": {"reset": {"by_platform": {"echo": {"idle_minutes": 5}, "ecoh": {"idle_minutes": 5}}}}},
     "sessions.reset.by_platform.ecoh",
     f'unknown key "ecoh" (did you mean "echo"?); valid keys here: {SHIPPED}, echo '
     "(these are the installed platforms; another one comes with its adapter package)"),
    ("reset value", {"sessions": {"reset": {"by_platform": {"echo": {"mode": "sometimes"}}}}},
     "sessions.reset.by_platform.echo.mode", 'must be one of idle, daily, both, none (got "sometimes")'),
]


@pytest.mark.parametrize("data,key,message", [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN])
def test_a_platform_that_is_not_installed_is_refused_naming_the_installed_ones(echo_site, data, key, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, env={})
    assert info.value.key == key
    assert str(info.value) == f"{key}: {message}"
    assert info.value.exit_code == 78


def test_config_check_refuses_an_unknown_reset_platform_with_exit_78(tmp_path, echo_site):
    path = tmp_path / "config.yaml"
    path.write_text("sessions:\n  reset:\n    by_platform:\n      xmpp: {mode: none}\n", encoding="utf-8")
    result = CliRunner().invoke(config_group, ["check", "--config", str(path)])
    assert result.exit_code == 78
    assert result.stderr.splitlines() == [
        f'error: {path}: sessions.reset.by_platform.xmpp: unknown key "xmpp"; valid keys here: '
        f"{SHIPPED}, echo (these are the installed platforms; another one comes with its adapter package)"
    ]


def test_a_cron_job_delivers_to_the_installed_platform(echo_site):
    assert str(parse_target("echo:42")) == "echo:42"
    assert str(parse_target("Echo:room-1:thread-9")) == "echo:room-1:thread-9"
    with pytest.raises(ValueError) as info:
        parse_target("irc:#general")
    assert str(info.value) == (
        "unknown delivery target 'irc:#general'; use local, telegram:<chat_id>[:<topic_id>], discord:<channel_id>, "
        "slack:<channel_id>[:<thread_ts>], "
        + "".join(f"{FORMS.get(name, name + ':<chat_id>[:<thread_id>]')}, " for name in BUILT_IN[3:])
        + "echo:<chat_id>[:<thread_id>]")
    with pytest.raises(ValueError, match=r"'echo:' is not a echo target; write echo:<chat_id>\[:<thread_id>\]"):
        parse_target("echo:")
    cfg = config_from_dict({"cron": {"jobs": [{"id": "daily", "schedule": "0 8 * * *", "prompt": "hi",
                                               "deliver": "echo:42"}]}}, env={})
    assert [spec.deliver for spec, _ in config_jobs(cfg, now=time.time())] == ["echo:42"]


# --------------------------------------------------------------------------- the CLI, as a process


def switchboard(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SWITCHBOARD, *args], capture_output=True, text=True, env=with_echo(site), timeout=60)


def test_the_cli_offers_the_installed_platform(tmp_path, echo_site):
    home = tmp_path / "home"
    with state.SessionDB(home / "state.db") as db:
        db.sessions.create("s-echo", "echo", user_id="42")
        db.sessions.create("s-tg", "telegram", user_id="7")

    listed = switchboard(echo_site, "sessions", "list", "--source", "Echo", "--json", "--home", str(home))
    assert listed.returncode == 0, listed.stderr
    assert [(s["id"], s["source"]) for s in json.loads(listed.stdout)] == [("s-echo", "echo")]

    helped = switchboard(echo_site, "pairing", "approve", "--help")
    assert "{" + "|".join(BUILT_IN) + "|echo}" in "".join(helped.stdout.split())  # click wraps a long list

    refused = switchboard(echo_site, "sessions", "list", "--source", "irc", "--home", str(home))
    assert refused.returncode == 2
    assert ("'irc' is not one of " + ", ".join(f"'{n}'" for n in (*BUILT_IN, "echo", "api", "cli", "cron"))
            in refused.stderr), refused.stderr


# --------------------------------------------------------------------------- the daemon, as a process


async def _wait_for_lines(path: Path, count: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        await asyncio.sleep(0.05)


def _echo_config(tmp_path: Path, model_url: str, run: int, allowed: list[str]) -> Path:
    """The daemon's config; each ``run`` has its own inbox and outbox (a reload restarts the adapter on them)."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "home": str(tmp_path / "home"),
        "model": {"base_url": model_url, "name": "fake-model"},
        "api": {"port": 0},
        "ui": {"enabled": True, "allow_local_writes": True},
        "auth": {"allowed_users": allowed},
        "identities": {"alice": ["echo:42", "telegram:7"]},
        "sessions": {"reset": {"by_platform": {"echo": {"mode": "none"}}}},
        "platforms": {"echo": {"inbox": str(tmp_path / f"inbox{run}.jsonl"), "outbox": str(tmp_path / f"outbox{run}.jsonl")}},
    }), encoding="utf-8")
    return config


def _inbox(tmp_path: Path, run: int, *messages: tuple[str, str, str]) -> None:
    (tmp_path / f"inbox{run}.jsonl").write_text(
        "".join(json.dumps({"id": i, "user": u, "text": t}) + "\n" for i, u, t in messages), encoding="utf-8")


async def test_the_daemon_runs_the_installed_platform_and_reloads_it(tmp_path, echo_site):
    _inbox(tmp_path, 1, ("m1", "42", "hello from echo"), ("m2", "43", "let me in"))
    _inbox(tmp_path, 2, ("m3", "44", "after the reload"), ("m4", "42", "still me"))
    async with FakeModel() as model:
        config = _echo_config(tmp_path, model.base_url, 1, ["echo:42"])
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {"NOTIFY_SOCKET": str(notify.path), "PYTHONPATH": with_echo(echo_site)["PYTHONPATH"]})
        try:
            status = await notify.wait_for(lambda line: line.startswith("STATUS=serving"))
            assert status.endswith("telegram: off: platforms.telegram.token is not set, discord: off: platforms.discord.token "
                                   "is not set, slack: off: platforms.slack.bot_token is not set, "
                                   + "".join(f"{name}: {why}, " for name, why in OFF.items()) + "echo: connected"), status
            first = await _wait_for_lines(tmp_path / "outbox1.jsonl", 2)
            port = int(re.search(r"API on 127\.0\.0\.1:(\d+)", status).group(1))
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    health = await response.json()
                async with http.get(f"http://127.0.0.1:{port}/ui/pairing") as response:
                    pairing_page = await response.text()
                async with http.get(f"http://127.0.0.1:{port}/ui/sessions?platform=echo") as response:
                    sessions_page = await response.text()

            # SIGHUP: echo:44 is allowed now, and echo's changed section restarts its adapter on the new inbox
            _echo_config(tmp_path, model.base_url, 2, ["echo:42", "echo:44"])
            notify.received.clear()
            proc.send_signal(signal.SIGHUP)
            await notify.wait_for(lambda line: line == "STATUS=serving")
            second = await _wait_for_lines(tmp_path / "outbox2.jsonl", 2)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
            notify.close()
        stderr = (await proc.stderr.read()).decode()
    assert code == 0, stderr

    by_chat = {r["chat"]: r["text"] for r in first}
    assert by_chat["42"] == "echo: hello from echo | turns: 1 | first: hello from echo"  # allowed: the model answered
    assert "switchboard pairing approve echo " in by_chat["43"]  # a stranger: a pairing code, no model call
    assert health["platforms"]["echo"]["state"] == "connected"
    assert "<option>echo</option>" in pairing_page
    assert "unknown platform" not in sessions_page and 'value="echo" selected' in sessions_page
    assert {r["chat"]: r["text"] for r in second} == {
        "44": "echo: after the reload | turns: 1 | first: after the reload",
        "42": "echo: still me | turns: 2 | first: hello from echo",  # the same session as before the reload
    }
    assert len(model.requests) == 3

    code_43 = re.search(r"switchboard pairing approve echo (\S+)", by_chat["43"]).group(1)
    approved = switchboard(echo_site, "pairing", "approve", "echo", code_43, "--config", str(config))
    assert approved.returncode == 0, approved.stderr
    with state.SessionDB(tmp_path / "home" / "state.db") as db:
        assert [(a["platform"], a["user_id"]) for a in db.pairing.list()["approved"]] == [("echo", "43")]
