"""`switchboard setup`: a newcomer's answers in, a working config out, and the first DM answered.

The terminal test types what a person would into a real pseudo-terminal (tests/ptykit.py), against
the fake model and the fake Telegram (tests/fakes/), then starts a real daemon on the files setup
wrote and sends the owner's first DM.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
from pathlib import Path

import yaml

from gateway.config import platform_models
from tests.crashkit import SWITCHBOARD, NotifySocket, start_daemon
from tests.fakes.discord import FakeDiscord
from tests.fakes.matrix import FakeMatrix
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.ptykit import Terminal
from tests.waiting import eventually

ANN = FakeTelegram.user(111, "Ann", username="ann")
# every platform after the first four that setup offers, in turn (its package's SETUP), declined
LATER = [(rf"Set up {re.escape(model.SETUP.title)}\? \[y/N\]", "\r") for name, model in platform_models().items()
         if model.SETUP is not None and name not in ("telegram", "discord", "slack", "email")]


def _env(tmp_path: Path, tg: FakeTelegram) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHBOARD_", "TELEGRAM_", "DISCORD_", "SLACK_"))}
    return {**keep, "HOME": str(tmp_path / "user"), "TELEGRAM_BASE_URL": tg.base_url, "NO_COLOR": "1",
            "HTTP_PROXY": "", "HTTPS_PROXY": "", "http_proxy": "", "https_proxy": ""}


async def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def expect(term: Terminal, pattern: str, timeout: float = 90) -> str:
    """Wait until the screen shows ``pattern`` (a regex) after what was already matched; return the screen."""
    await eventually(lambda: re.search(pattern, term.text()), timeout, lambda: f"{pattern!r} on the screen:\n{term.text()}")
    return term.text()


def _secret_free(config: Path, *secrets: str) -> None:
    text = config.read_text()
    for secret in secrets:
        assert secret not in text


async def test_a_newcomer_in_a_terminal_gets_a_bot_that_answers_their_first_dm(tmp_path):
    home = tmp_path / "user" / ".switchboard"
    async with FakeModel() as model, FakeTelegram() as tg:
        model.served, model.max_model_len = ["llama3.2:1b", "qwen2.5:7b"], 32768
        env = _env(tmp_path, tg)
        bare = model.base_url.removesuffix("/v1")  # the address as people copy it, without /v1
        term = Terminal([str(SWITCHBOARD), "setup"], env=env)
        try:
            await expect(term, r"Which model server\?")
            await expect(term, r"Number \[\d\]: ")
            term.type("6\r")  # another address
            await expect(term, r"Its base URL")
            term.type(bare + "\r")
            await expect(term, r"(?s)Which model\?.*Number \[1\]: ")
            term.type("2\r")
            await expect(term, r"the model answered: ")
            await expect(term, r"Set up Telegram\? \[Y/n\]")
            term.type("\r")
            await expect(term, r"Telegram bot token: ")
            term.type(tg.token + "\r")
            await expect(term, r"Set up Discord\? \[y/N\]")
            term.type("\r")
            await expect(term, r"Set up Slack\? \[y/N\]")
            term.type("\r")
            await expect(term, r"Set up Email\? \[y/N\]")
            term.type("\r")
            for pattern, typed in LATER:
                await expect(term, pattern)
                term.type(typed)
            await expect(term, r"Send any message to @switchboard_bot now")
            await asyncio.sleep(0)
            await eventually(lambda: tg.calls("getUpdates"), 10, "setup polling for the owner's message")
            tg.dm(ANN, "hello, it's me")
            await expect(term, r"Make this account the owner.*\[Y/n\]")
            term.type("\r")
            screen = await expect(term, r"Done\. Start it now|Install it as a systemd service", timeout=60)
            if "Install it as a systemd service" in screen:
                term.type("none\r")
            await expect(term, r"Done\. Start it now")
            assert term.wait(30) == 0
        finally:
            term.close()
        screen = term.text()
        # what the newcomer saw, in order
        assert f"{bare} answers at /v1: using {model.base_url}" in screen
        assert "it serves llama3.2:1b, qwen2.5:7b" in screen
        assert "context window: 32,768 tokens (as the server reports it)" in screen
        assert "open @BotFather, send /newbot" in screen
        assert "Telegram: the token works (@switchboard_bot)" in screen
        assert 'A message from Ann (@ann), Telegram id 111: "hello, it\'s me"' in screen
        assert "✓ telegram: token valid (@switchboard_bot)" in screen and "✓ model:" in screen
        assert tg.token not in screen  # typed hidden, never echoed
        greeting = [s for s in tg.sent if s.chat_id == 111]
        assert len(greeting) == 1 and greeting[0].visible_text.startswith("Hello Ann! You are this Switchboard's owner")

        # the files: the model and the owner in the config, the token only in the 0600 env file
        config, env_file = home / "config.yaml", home / "switchboard.env"
        data = yaml.safe_load(config.read_text())
        assert data["model"] == {"base_url": model.base_url, "name": "qwen2.5:7b",
                                 "api_key": "${SWITCHBOARD_MODEL_KEY:-not-needed}", "context_length": 32768}
        assert data["auth"] == {"allowed_users": ["telegram:111"]} and data["tools"] == {"approvers": ["telegram:111"]}
        _secret_free(config, tg.token)
        assert f"TELEGRAM_BOT_TOKEN={tg.token}" in env_file.read_text()
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and stat.S_IMODE(home.stat().st_mode) == 0o700

        # a real daemon on that config: the owner's first DM is answered, no pairing code
        notify = NotifySocket(tmp_path / "notify.sock")
        proc = await start_daemon(config, {**env, "NOTIFY_SOCKET": str(notify.path), "SWITCHBOARD_API_PORT": "0"})
        try:
            status = await notify.wait_for(lambda line: line.startswith("STATUS=serving"), timeout=60)
            assert "telegram: connected" in status
            before = len(tg.sent)
            tg.dm(ANN, "what can you do?")
            sent = await tg.wait_for_sent(before + 1, timeout=30)
            assert sent[-1].chat_id == 111 and "echo: what can you do?" in sent[-1].visible_text
            assert "hello, it's me" not in " ".join(s.visible_text for s in sent[before:])  # setup's message not re-answered
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_scripted_with_flags_writes_the_same_files_and_fails_clearly(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        env = _env(tmp_path, tg)
        home = tmp_path / "sb"
        argv = [str(SWITCHBOARD), "setup", "--yes", "--home", str(home), "--model-url", model.base_url,
                "--telegram-token", tg.token, "--owner", "telegram:111"]
        code, out = await _run(argv, env)
        assert code == 0, out
        assert "All checks passed." in out and tg.token not in out
        data = yaml.safe_load((home / "config.yaml").read_text())
        assert data["model"]["name"] == "fake-model" and data["auth"]["allowed_users"] == ["telegram:111"]
        _secret_free(home / "config.yaml", tg.token)
        # once there, the config is kept unless --force
        code, out = await _run(argv, env)
        assert code == 1 and f"{home / 'config.yaml'} exists: pass --force" in out
        # a bad token is named at once, with where to get a good one
        code, out = await _run([*argv[:-4], "--telegram-token", "999:wrong-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "--force"], env)
        assert code == 1 and "Telegram refused the token (HTTP 401" in out and "@BotFather" in out
        # a model server that is not there
        code, out = await _run([str(SWITCHBOARD), "setup", "--yes", "--home", str(tmp_path / "other"),
                                "--model-url", "http://127.0.0.1:9/v1"], env)
        assert code == 1 and "cannot reach http://127.0.0.1:9/v1: connection refused" in out
        assert not (tmp_path / "other" / "config.yaml").exists()


def test_setup_is_listed_in_the_help() -> None:
    import subprocess

    done = subprocess.run([SWITCHBOARD, "--help"], capture_output=True, text=True, timeout=60)
    assert re.search(r"^\s+setup\s", done.stdout, re.M), done.stdout


async def _setup_in_a_terminal(argv: list[str], env: dict[str, str], answers: list[tuple[str, str]]) -> str:
    """Run setup in a pseudo-terminal, typing each answer once its pattern shows; the whole screen."""
    term = Terminal([str(SWITCHBOARD), "setup", *argv], env=env)
    try:
        for pattern, typed in answers:
            await expect(term, pattern)
            term.type(typed)
        screen = await expect(term, r"Done\. Start it now|Install it as a systemd service", timeout=60)
        if "Install it as a systemd service" in screen:
            term.type("none\r")
        await expect(term, r"Done\. Start it now")
        assert term.wait(30) == 0
        return term.text()
    finally:
        term.close()


async def test_on_discord_the_owner_is_the_applications_owner_as_the_developer_portal_says(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg, FakeDiscord() as dc:
        env = {**_env(tmp_path, tg), "DISCORD_API_BASE_URL": dc.api_base_url}
        home = tmp_path / "sb"
        screen = await _setup_in_a_terminal(
            ["--home", str(home), "--model-url", model.base_url, "--model", "fake-model", "--context-length", "8192", "--discord-token", dc.token],
            env, [(r"Set up Telegram\? \[Y/n\]", "n\r"), (r"Set up Slack\? \[y/N\]", "\r"),
                  (r"Set up Email\? \[y/N\]", "\r"), *LATER, (r"Make this account the owner.*\[Y/n\]", "\r")])
    assert f"The application's owner in the Developer Portal: Alice, Discord id {dc.alice['id']}" in screen
    data = yaml.safe_load((home / "config.yaml").read_text())
    assert data["auth"] == {"allowed_users": [f"discord:{dc.alice['id']}"]}
    assert data["tools"] == {"approvers": [f"discord:{dc.alice['id']}"]}
    assert dc.token not in screen


async def test_on_slack_the_owners_member_id_is_looked_up_so_a_typo_is_caught_at_once(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg, FakeSlack() as slack:
        env = {**_env(tmp_path, tg), "SLACK_API_BASE_URL": slack.base_url}
        home = tmp_path / "sb"
        screen = await _setup_in_a_terminal(
            ["--home", str(home), "--model-url", model.base_url, "--model", "fake-model", "--context-length", "8192",
             "--slack-bot-token", slack.bot_token, "--slack-app-token", slack.app_token],
            env, [(r"Set up Telegram\? \[Y/n\]", "n\r"), (r"Set up Discord\? \[y/N\]", "\r"),
                  (r"Set up Email\? \[y/N\]", "\r"), *LATER, (r"Your Slack member ID.*: ", "U9\r"), (r"Slack knows no member U9", ""),
                  (r"(?s)U9 in this workspace.*Your Slack member ID.*: ", "U1\r"),
                  (r"Make this account the owner.*\[Y/n\]", "\r")])
    assert "Slack member U1: alice" in screen
    assert yaml.safe_load((home / "config.yaml").read_text())["auth"] == {"allowed_users": ["slack:U1"]}
    assert slack.bot_token not in screen


async def test_email_is_offered_from_its_package_and_a_server_that_is_not_there_is_named_and_asked_again(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg:
        term = Terminal([str(SWITCHBOARD), "setup", "--home", str(tmp_path / "sb"), "--model-url", model.base_url,
                         "--model", "fake-model", "--context-length", "8192"], env=_env(tmp_path, tg))
        try:
            for pattern, typed in [(r"Set up Telegram\? \[Y/n\]", "n\r"), (r"Set up Discord\? \[y/N\]", "\r"),
                                   (r"Set up Slack\? \[y/N\]", "\r"), (r"Set up Email\? \[y/N\]", "y\r"),
                                   (r"IMAP server \(imap\.example\.com\): ", "127.0.0.1\r"),
                                   (r"SMTP server \(smtp\.example\.com\): ", "127.0.0.1\r"),
                                   (r"The mailbox's login.*: ", "bot@example.com\r"),
                                   (r"Its password.*: ", "hunter2-not-shown\r")]:
                await expect(term, pattern)
                term.type(typed)
            screen = await expect(term, r"(?s)✗ Email: .*IMAP server \(imap\.example\.com\): ", timeout=60)
        finally:
            term.close()
    assert "A mailbox of its own for the gateway" in screen  # the package's own guide
    assert re.search(r"Email: .*127\.0\.0\.1.*993", screen), screen  # the server it tried, by address and port
    assert "hunter2-not-shown" not in screen and not (tmp_path / "sb" / "config.yaml").exists()


async def test_a_platform_beyond_the_first_three_is_set_up_from_its_package_matrix_against_a_homeserver(tmp_path):
    async with FakeModel() as model, FakeTelegram() as tg, FakeMatrix() as hs:
        home = tmp_path / "sb"
        decline = [(pattern, typed) for pattern, typed in LATER if "Matrix" not in pattern]
        screen = await _setup_in_a_terminal(
            ["--home", str(home), "--model-url", model.base_url, "--model", "fake-model", "--context-length", "8192"],
            _env(tmp_path, tg),
            [(r"Set up Telegram\? \[Y/n\]", "n\r"), (r"Set up Discord\? \[y/N\]", "\r"), (r"Set up Slack\? \[y/N\]", "\r"),
             (r"Set up Email\? \[y/N\]", "\r"), (r"Set up Matrix\? \[y/N\]", "y\r"),
             (r"Homeserver address \[https://matrix\.org\]: ", hs.base_url + "\r"),
             (r"The bot's access token: ", "syt_wrong_token\r"), (r"✗ Matrix refused the token", ""),
             (r"(?s)refused the token.*Homeserver address.*: ", hs.base_url + "\r"),
             (r"(?s)refused the token.*The bot's access token: ", hs.token + "\r"),
             *decline])
    assert "Matrix: the token works" in screen and "Element: Settings -> Help & About -> Access Token" in screen
    assert hs.token not in screen and "syt_wrong_token" not in screen
    config = yaml.safe_load((home / "config.yaml").read_text())
    assert config["platforms"]["matrix"] == {"homeserver": hs.base_url, "access_token": "${MATRIX_ACCESS_TOKEN}"}
    assert f"MATRIX_ACCESS_TOKEN={hs.token}" in (home / "switchboard.env").read_text()
