"""Text is made safe at the adapter boundary, the same on every platform.

Lone surrogates (JSON can carry ``"\\ud800"``) become U+FFFD, surrogate pairs
the character they encode, a carriage return a newline, and NUL and the other
C0 controls except tab and newline are dropped (``gateway.types.clean_text``).
The property tests send arbitrary strings from each fake platform through the
real client library, our adapter and the real gateway, then read the stored
text back from state.db as bytes: valid UTF-8, equal to the sanitised input
(after the platform's own whitespace tidying, which each adapter documents).
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing

import aiohttp
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from gateway.runtime.daemon import Gateway
from gateway.types import Attachment, ChatType, InboundMessage, clean_text
from tests.fakes.discord import FakeDiscord
from tests.fakes.model_server import FakeModel
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.harness import eventually, gateway_config, running_gateway

# Any code point, with lone surrogates and C0 controls drawn often.  The characters of the platforms'
# own markup (mentions, commands, Slack's <link|label> and &amp;) are left out: they are rewritten by
# the adapters on purpose and tested with them.
MARKUP = "<>&@/"
CHARS = st.one_of(
    st.characters(exclude_characters=MARKUP),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
    st.characters(max_codepoint=0x1F),
    st.sampled_from(["\r\n", "\r", " ", "\t", "\n", "\x00", "\x7f", "\u2028", "\ufeff"]),
)
TEXTS = st.lists(CHARS, min_size=1, max_size=40).map("".join)
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ANN = FakeTelegram.user(111, "Ann")


def tidy_telegram(text: str) -> str:
    return text.strip()


def tidy_slack(text: str) -> str:
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def tidy_discord(text: str) -> str:
    text = re.sub(r"[ \t]{2,}", " ", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()


def stored_user_text(db_path, platform_message_id: str) -> bytes | None:
    """The stored content of the user message with this platform id, as raw bytes."""
    with closing(sqlite3.connect(db_path)) as conn:
        row = conn.execute("SELECT CAST(content AS BLOB) FROM messages WHERE role = 'user' AND platform_message_id = ?",
                           (platform_message_id,)).fetchone()
    return row[0] if row else None


async def stored_text(gw: Gateway, platform_message_id: str) -> str:
    raw = await eventually(lambda: stored_user_text(gw.config.db_path, platform_message_id), timeout=10,
                           what=f"message {platform_message_id} stored")
    return raw.decode("utf-8")  # strict: raises on anything that is not valid UTF-8


# -- the function ---------------------------------------------------------------------------


@pytest.mark.parametrize("given_text, expected", [
    ("bad \ud800 text", "bad \ufffd text"),
    ("\udfff\ud800", "\ufffd\ufffd"),
    ("pair \ud83d\ude00 joined", "pair \U0001F600 joined"),
    ("nul\x00 bell\x07 esc\x1b[31m", "nul bell esc[31m"),
    ("tab\tand\nnewline kept", "tab\tand\nnewline kept"),
    ("windows\r\nold mac\rend", "windows\nold mac\nend"),
    ("del \x7f and C1 \x85 are not C0", "del \x7f and C1 \x85 are not C0"),
])
def test_clean_text(given_text, expected):
    assert clean_text(given_text) == expected
    assert clean_text(expected) == expected


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(codec=None, categories=None), max_size=60) | TEXTS)
def test_clean_text_is_valid_utf8_idempotent_and_keeps_ordinary_text(text):
    cleaned = clean_text(text)
    cleaned.encode("utf-8")  # no surrogate survives
    assert not re.search(r"[\x00-\x08\x0b-\x1f]", cleaned)
    assert clean_text(cleaned) == cleaned
    if not re.search(r"[\x00-\x08\x0b-\x1f\ud800-\udfff]", text):
        assert cleaned is text


def test_every_text_field_of_the_boundary_types_is_cleaned():
    msg = InboundMessage("api", ChatType.DM, "chat\x00", "user\ud800", "hi\x00", message_id="m\r1",
                         thread_id="t\x07", user_name="Ann\udc00\x1b",
                         attachments=(Attachment("file", "report\x00\ud800.pdf", "text/plain\x00"),))
    assert (msg.chat_id, msg.user_id, msg.text, msg.message_id, msg.thread_id, msg.user_name) == (
        "chat", "user\ufffd", "hi", "m\n1", "t", "Ann\ufffd")
    assert (msg.attachments[0].name, msg.attachments[0].mime_type) == ("report\ufffd.pdf", "text/plain")


# -- the case: a poison Telegram DM no longer wedges the chat ------------------------------


@pytest.fixture
async def telegram(tmp_path):
    async with FakeTelegram() as tg, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["telegram:111", "telegram:222"]},
                                platforms={"telegram": {"token": tg.token, "base_url": tg.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await tg.wait_for(lambda: gw.health()["platforms"]["telegram"]["state"] == "connected", what="connected")
            yield tg, gw
        finally:
            await gw.stop(grace_seconds=5)


async def test_a_telegram_dm_with_a_lone_surrogate_is_stored_sanitised_and_answered_and_so_is_the_next(telegram):
    tg, gw = telegram
    poison = tg.dm(ANN, "bad \ud800 text")
    [reply] = await tg.wait_for_sent(1, timeout=10)
    assert reply.visible_text.startswith("echo: bad \ufffd text")
    assert await stored_text(gw, str(poison["message"]["message_id"])) == "bad \ufffd text"
    after = tg.dm(ANN, "next")
    sent = await tg.wait_for_sent(2, timeout=10)
    assert sent[1].visible_text.startswith("echo: next | turns: 2")
    await tg.wait_until_confirmed(after)


async def test_user_and_file_names_with_controls_and_surrogates_are_stored_clean(telegram):
    tg, gw = telegram
    odd = FakeTelegram.user(222, "Bo\ud800b\x00")
    update = tg.dm(odd, None, caption="see \x07file", document={
        "file_id": "d1", "file_unique_id": "ud1", "file_name": "notes\udfff\x1b.txt", "mime_type": "text/plain",
        "file_size": 10})
    await tg.wait_for_sent(1, timeout=10)
    assert await stored_text(gw, str(update["message"]["message_id"])) == "see file\n[attached document: notes\ufffd.txt]"
    with closing(sqlite3.connect(gw.config.db_path)) as conn:
        [(name,)] = conn.execute("SELECT CAST(user_name AS BLOB) FROM sessions WHERE source = 'telegram'").fetchall()
    assert name.decode("utf-8") == "Bo\ufffdb"


# -- arbitrary strings through each adapter's parse-and-store path ----------------------------------


@PROPERTY
@given(text=TEXTS)
async def test_any_telegram_text_is_stored_as_its_sanitised_form(telegram, text):
    expected = tidy_telegram(clean_text(text))
    assume(expected)
    tg, gw = telegram
    update = tg.dm(ANN, text)
    assert await stored_text(gw, str(update["message"]["message_id"])) == expected


@pytest.fixture
async def slack(tmp_path, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with FakeSlack() as fake, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": ["slack:U1"]},
                                platforms={"slack": {"bot_token": fake.bot_token, "app_token": fake.app_token,
                                                     "api_base_url": fake.base_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await eventually(lambda: gw.health()["platforms"]["slack"]["state"] == "connected", timeout=10)
            await fake.wait_connected()
            yield fake, gw
        finally:
            await gw.stop(grace_seconds=5)


@PROPERTY
@given(text=TEXTS)
async def test_any_slack_text_is_stored_as_its_sanitised_form(slack, text):
    expected = tidy_slack(clean_text(text))
    assume(expected)
    fake, gw = slack
    event = fake.message("D1", "U1", text)
    await fake.send_event(event)
    assert await stored_text(gw, event["ts"]) == expected


@pytest.fixture
async def discord(tmp_path):
    async with FakeDiscord() as dc, FakeModel() as model:
        config = gateway_config(tmp_path / "home", model.base_url, auth={"allowed_users": [f"discord:{dc.alice['id']}"]},
                                platforms={"discord": {"token": dc.token, "api_base_url": dc.api_base_url,
                                                       "gateway_url": dc.gateway_url}})
        gw = Gateway(config, serve_api=False)
        await gw.start()
        try:
            await dc.wait_until(lambda: gw.health()["platforms"]["discord"]["state"] == "connected", 10, "connected")
            yield dc, gw
        finally:
            await gw.stop(grace_seconds=5)


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
@PROPERTY
@given(text=TEXTS)
async def test_any_discord_text_is_stored_as_its_sanitised_form(discord, text):
    # Discord's gateway speaks UTF-8 JSON, so a lone surrogate never reaches a client (discord.py parses with
    # orjson when it is installed, as langchain-openai's test dependencies install it, and refuses one).
    text = "".join(c for c in text if not "\ud800" <= c <= "\udfff")
    expected = tidy_discord(clean_text(text))
    assume(expected)
    dc, gw = discord
    msg = await dc.dm(dc.alice, text)
    assert await stored_text(gw, msg["id"]) == expected


async def test_the_local_api_gets_the_same_treatment(tmp_path):
    # A lone surrogate is refused with a 400 naming the field (test_api_service.py); control
    # characters are cleaned like a platform's.
    body = {"model": "switchboard", "messages": [{"role": "user", "content": "from a script \x00\x07 with\r\nCRLF"}]}
    async with FakeModel() as model:
        async with running_gateway(tmp_path / "home", model) as gw:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"http://127.0.0.1:{gw.api.bound_port}/v1/chat/completions", data=json.dumps(body),
                                     headers={"Content-Type": "application/json", "X-Session-Key": "ops"}) as resp:
                    assert resp.status == 200, await resp.text()
                    reply = (await resp.json())["choices"][0]["message"]["content"]
            with closing(sqlite3.connect(gw.config.db_path)) as conn:
                [(raw,)] = conn.execute("SELECT CAST(content AS BLOB) FROM messages WHERE role = 'user'").fetchall()
    assert raw.decode("utf-8") == "from a script  with\nCRLF"
    assert reply.startswith("echo: from a script  with\nCRLF")
