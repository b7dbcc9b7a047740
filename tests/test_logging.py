"""Logging: JSON lines or text, and no secret ever reaches the output."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gateway.config import load_config
from gateway.logging_setup import setup_logging

TG_TOKEN = "7012345678:AAGk3v9-fakeTokenForTheLoggingTests_xyz"
KNOWN_SECRET = "correct horse battery staple"  # not token-shaped: only the config knows it
SLACK_BOT = "xoxb-2222-3333-notARealSlackToken"
SLACK_APP = "xapp-1-A0123-4567-notARealAppToken"
OPENAI_KEY = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"
DISCORD = "MTA5ODc2NTQzMjEwOTg3NjU0.GabCdE.abcdefghijklmnopqrstuvwxyz0123456"


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    saved = (root.level, logging.getLogger("httpx").level, logging.getLogger("httpcore").level)
    yield
    for handler in [h for h in root.handlers if type(h).__module__ == "gateway.logging_setup"]:
        root.removeHandler(handler)
    root.setLevel(saved[0])
    logging.getLogger("httpx").setLevel(saved[1])
    logging.getLogger("httpcore").setLevel(saved[2])


def setup(*args, **kwargs) -> None:
    """setup_logging, then drop pytest's capture handler: it would see each record first, unmasked,
    and raise on the deliberately broken format call (pytest puts it back after the test)."""
    setup_logging(*args, **kwargs)
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if type(h).__module__ == "gateway.logging_setup"]


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_ts_level_logger_msg_and_extras():
    out = io.StringIO()
    setup("INFO", "json", stream=out)
    log = logging.getLogger("gateway.router")
    log.info("session %s reset: %s", "s1", "idle", extra={"platform": "telegram", "chat_id": 42})
    log.debug("not shown at INFO")
    (line,) = json_lines(out)
    assert line["level"] == "INFO"
    assert line["logger"] == "gateway.router"
    assert line["msg"] == "session s1 reset: idle"
    assert (line["platform"], line["chat_id"]) == ("telegram", 42)
    assert line["ts"].endswith("+00:00") and "T" in line["ts"]


def test_auto_is_json_when_not_a_terminal_and_text_on_a_terminal():
    out = io.StringIO()
    setup("INFO", "auto", stream=out)
    logging.getLogger("x").warning("hello %d", 1)
    assert json_lines(out)[0]["msg"] == "hello 1"

    leader, follower = os.openpty()
    with os.fdopen(follower, "w", encoding="utf-8", closefd=True) as tty:
        setup("INFO", "auto", stream=tty)
        logging.getLogger("gateway.runtime.daemon").warning("hello %d", 2)
        tty.flush()
        text = os.read(leader, 4096).decode()
    os.close(leader)
    assert "WARNING gateway.runtime.daemon: hello 2" in text
    assert not text.lstrip().startswith("{")


def test_setting_up_twice_replaces_the_handler():
    out1, out2 = io.StringIO(), io.StringIO()
    setup("INFO", "json", stream=out1)
    setup("INFO", "json", stream=out2)
    logging.getLogger("x").info("once")
    assert out1.getvalue() == ""
    assert [line["msg"] for line in json_lines(out2)] == ["once"]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_secrets_in_messages_args_exceptions_urls_and_extras_never_appear(fmt):
    out = io.StringIO()
    setup("DEBUG", fmt, secrets=[KNOWN_SECRET, TG_TOKEN], stream=out)
    log = logging.getLogger("adapters.telegram")
    log.info("starting with token %s", TG_TOKEN)
    log.info(f"inline f-string {KNOWN_SECRET}")
    log.info("GET https://api.telegram.org/bot%s/getUpdates?offset=5", TG_TOKEN)
    log.info("slack %s %s", SLACK_BOT, SLACK_APP)
    log.info("headers %r", {"Authorization": f"Bearer {OPENAI_KEY}"})
    log.info("discord Authorization: Bot %s", DISCORD)
    log.info("callback https://example.org/hook?token=abc123secretvalue&x=1")
    log.warning("context", extra={"detail": f"token={TG_TOKEN}", "nested": {"k": [KNOWN_SECRET]}})
    try:
        raise RuntimeError(f"Invalid token {TG_TOKEN} rejected, key {OPENAI_KEY}, pass {KNOWN_SECRET}")
    except RuntimeError:
        log.exception("startup failed")
    log.info("trace", stack_info=True, extra={"why": KNOWN_SECRET})

    output = out.getvalue()
    for secret in (TG_TOKEN, KNOWN_SECRET, SLACK_BOT, SLACK_APP, OPENAI_KEY, DISCORD, "abc123secretvalue"):
        assert secret not in output
    assert "7012345678:" not in output and "AAGk3v9" not in output
    assert "https://api.telegram.org/bot***/getUpdates?offset=5" in output
    assert "Bearer ***" in output
    assert "hook?token=***&x=1" in output
    assert "RuntimeError: Invalid token *** rejected, key ***, pass ***" in output
    assert output.count("starting with token ***") == 1


def test_a_failing_format_call_is_still_logged_and_masked():
    out = io.StringIO()
    setup("INFO", "json", stream=out)
    logging.getLogger("x").info("two args %s %s", TG_TOKEN)  # one missing
    output = out.getvalue()
    assert TG_TOKEN not in output and "two args" in output


def test_config_secrets_feed_the_redactor(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("platforms:\n  discord:\n    token: plain-discord-secret-value\napi:\n  token: api-secret-value\n")
    cfg = load_config(path, env={})
    out = io.StringIO()
    setup(cfg.logging.level, "json", secrets=cfg.secrets(), stream=out)
    logging.getLogger("adapters.discord").error("login failed for %s / %s", cfg.platforms.discord.token, cfg.api.token)
    assert json_lines(out)[0]["msg"] == "login failed for *** / ***"


def test_short_secrets_are_not_masked_and_that_is_said():
    out = io.StringIO()
    setup("INFO", "json", secrets=["abc"], stream=out)
    (line,) = json_lines(out)
    assert line["level"] == "WARNING"
    assert line["msg"] == "1 configured secret(s) are shorter than 6 characters and are not masked in logs; use longer secrets"


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):  # keep the test server quiet
        pass


def test_a_real_library_logging_a_token_in_a_url_is_masked():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = io.StringIO()
        setup("DEBUG", "json", stream=out)  # DEBUG: httpx logs each request
        url = f"http://127.0.0.1:{server.server_port}/bot{TG_TOKEN}/getMe"
        assert httpx.get(url, headers={"Authorization": f"Bearer {OPENAI_KEY}"}).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    output = out.getvalue()
    assert TG_TOKEN not in output and OPENAI_KEY not in output
    requests = [line["msg"] for line in json_lines(out) if line["logger"] == "httpx"]
    assert requests == [f'HTTP Request: GET http://127.0.0.1:{server.server_port}/bot***/getMe "HTTP/1.1 200 OK"']


def test_httpx_request_lines_are_quiet_above_debug():
    setup("INFO", "json", stream=io.StringIO())
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING


def test_bad_level_or_format_is_refused():
    with pytest.raises(ValueError, match="log format must be auto, text or json"):
        setup("INFO", "xml")
    with pytest.raises(ValueError, match="log level must be"):
        setup("LOUD")


def test_a_library_logger_protected_by_an_adapter_is_masked_before_any_handler():
    """Whatever handler a library's record reaches (here one that is not ours), the adapter's token and
    Discord's interaction tokens are already masked; the adapters' error texts use the same redact()."""
    from gateway.logging_setup import protect_loggers, redact

    protect_loggers(["somelib.http"], "adapter-own-secret-value")
    seen = io.StringIO()
    foreign = logging.StreamHandler(seen)
    lib = logging.getLogger("somelib.http")
    lib.addHandler(foreign)
    lib.propagate = False
    try:
        lib.warning("POST /webhooks/1234567890/aNteRacTionToken.abc_123-x/messages with adapter-own-secret-value")
        lib.warning("event %r", {"t": "INTERACTION_CREATE", "d": {"token": "aW50ZXJhY3Rpb24"}})
    finally:
        lib.removeHandler(foreign)
        lib.propagate = True
    lines = seen.getvalue().splitlines()
    assert lines == ["POST /webhooks/1234567890/***/messages with ***",
                     "event {'t': 'INTERACTION_CREATE', 'd': {'token': '***'}}"]
    assert redact(f"401 for bot{TG_TOKEN} and adapter-own-secret-value") == "401 for bot*** and ***"


def test_logs_and_summaries_know_the_same_token_shapes():
    """One catalogue of token shapes (compression.redaction): every token the summarizer's redaction
    removes is masked in the logs too, and a Bot API URL's token is removed from a summary as from a log."""
    from compression.redaction import redact as redact_for_summary
    from gateway.logging_setup import redact

    tokens = ["ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "AKIAABCDEFGHIJKLMNOP", "glpat-abcdefghijklmnopqrstuv",
              "hf_abcdefghijklmnopqrstuvwxyz0123456", "xoxe-1-abcdefghijkl", TG_TOKEN, DISCORD, OPENAI_KEY]
    for token in tokens:
        assert redact(f"got {token} back") == "got *** back"
        assert redact_for_summary(f"got {token} back") == "got [REDACTED] back"
    url = f"https://api.telegram.org/bot{TG_TOKEN}/getMe"
    assert redact_for_summary(url) == "https://api.telegram.org/bot[REDACTED]/getMe"


async def test_at_debug_the_telegram_librarys_own_lines_carry_no_message_text():
    import telegram

    from tests.fakes.telegram import FakeTelegram

    out = io.StringIO()
    setup_logging("DEBUG", "json", stream=out)
    try:
        async with FakeTelegram() as tg:
            bot = telegram.Bot(tg.token, base_url=tg.base_url)
            async with bot:
                await bot.send_message(chat_id=111, text="my private words")
        logging.getLogger("gateway.test").debug("our own debug line")
    finally:
        setup_logging("INFO", "json", stream=io.StringIO())
    logged = out.getvalue()
    assert "our own debug line" in logged  # DEBUG is on
    assert "my private words" not in logged and "Calling Bot API endpoint" not in logged
