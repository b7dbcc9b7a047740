"""Streamed replies on Telegram, Discord and Slack: one message, edited in place, the final text exact and delivered once.

The real python-telegram-bot client against the fake Bot API, which records every call with the
time it arrived and checks HTML the way Telegram does.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from adapters.slack.mrkdwn import to_mrkdwn
from adapters.telegram.adapter import CHAT_RATE
from adapters.telegram.format import markdown_to_html
from gateway.formatting import utf16_len
from gateway.ratelimit import chat_budget_for
from gateway.streaming import ReplyStream, StreamPacing
from gateway.types import ChatRef
from tests.fakes.telegram import check_html
from tests.harness import eventually
from tests.recording import plain_fallbacks_in_metrics
from tests.test_adapter_slack import running, slack, started  # noqa: F401 - fixtures
from tests.test_adapter_telegram import bot, tg  # noqa: F401 - fixtures
from tests.test_chat_budget import discord_bot, discord_fake  # noqa: F401 - fixtures

DM = ChatRef("telegram", "111")
ARRIVAL_JITTER = 0.05


def to_chat(tg, chat_id: str = "111") -> list:
    return [r for r in tg.requests if str(r.params.get("chat_id")) == chat_id and r.method != "getUpdates"]


async def stream_words(stream: ReplyStream, text: str, *, every: float = 0.05, size: int = 6) -> None:
    """Feed ``text`` the way a model streams it: a few characters at a time."""
    for i in range(0, len(text), size):
        stream.feed(text[i:i + size])
        await asyncio.sleep(every)


async def test_first_text_shows_once_forty_characters_arrived_and_the_final_is_exact_and_sent_once(tg, bot):
    adapter, _ = bot
    answer = "**Sure.** Here is the plan, step by step, with `code` and a [link](https://ex.com)."
    stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=1.0))
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream.feed(answer[:45])
    [first] = await tg.wait_for_sent(1)
    assert first.at - started < 1.5, "the first text shows within 1.5 s of the first token"
    assert first.parse_mode is None and first.visible_text == answer[:45], "plain text while streaming"
    await stream_words(stream, answer[45:])
    delivery = await stream.finish(answer)
    assert delivery.ok and delivery.message_ids == (str(first.message_id),)
    assert len(tg.sent) == 1, "one message, edited in place"
    assert tg.sent[0].parse_mode == "HTML" and tg.sent[0].text == markdown_to_html(answer)
    assert tg.sent[0].visible_text == check_html(markdown_to_html(answer))


async def test_a_final_edit_whose_formatting_telegram_refuses_stays_plain_and_is_counted(tg, bot):
    adapter, _ = bot
    answer = "**Sure.** Here is the plan, step by step, with `code` in it."
    stream = ReplyStream(adapter, DM)
    stream.feed(answer)
    [shown] = await tg.wait_for_sent(1)
    assert shown.parse_mode is None and shown.visible_text == answer
    tg.fail_next("editMessageText", status=400, description="Bad Request: can't parse entities: Unsupported start tag")
    before = plain_fallbacks_in_metrics("telegram")
    delivery = await stream.finish(answer)
    assert delivery.ok and [m.visible_text for m in tg.sent] == [answer], "the plain text stays, nothing is lost"
    assert [c.get("parse_mode") for c in tg.calls("editMessageText")][-2:] == ["HTML", None]
    assert plain_fallbacks_in_metrics("telegram") == before + 1, "the fallback is counted in /metrics"


async def test_a_short_start_shows_after_a_second(tg, bot):
    adapter, _ = bot
    stream = ReplyStream(adapter, DM)
    loop = asyncio.get_running_loop()
    started = loop.time()
    stream.feed("Hmm")
    [first] = await tg.wait_for_sent(1)
    assert first.visible_text == "Hmm" and 1.0 - ARRIVAL_JITTER <= first.at - started < 1.5
    assert (await stream.finish("Hmm, yes.")).ok
    assert [m.visible_text for m in tg.sent] == ["Hmm, yes."]


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
async def test_edits_are_paced_and_only_sent_when_the_text_changed(tg, bot):
    adapter, _ = bot
    stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=1.0))
    answer = " ".join(f"word{i}" for i in range(120))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await stream_words(stream, answer, every=0.05, size=12)  # about 4 s of streaming
    streaming_seconds = loop.time() - started
    await asyncio.sleep(1.5)  # nothing new arrives: no edit either
    edits_before_final = len(tg.calls("editMessageText"))
    assert (await stream.finish(answer)).ok
    calls = [r.at for r in to_chat(tg)]
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert min(gaps) >= 0.25 - ARRIVAL_JITTER, "no two calls to one chat closer than 0.25 s, the final edit included"
    streamed = [r.at for r in to_chat(tg) if r.method in ("sendMessage", "editMessageText")][:edits_before_final + 1]
    assert all(b - a >= 1.0 - ARRIVAL_JITTER for a, b in zip(streamed, streamed[1:], strict=False)), "one edit a second at most"
    assert 2 <= edits_before_final <= streaming_seconds / 1.0 + 1
    assert [m.visible_text for m in tg.sent] == [answer]


@pytest.mark.slow  # 45 s measured under load: `make test-fast` leaves it out
async def test_a_429_mid_stream_silences_the_chat_and_the_final_still_arrives_once(tg, bot):
    for retry_after in (3, 40):  # a short flood wait, and one longer than any retry budget
        adapter, _ = bot
        tg.sent.clear()
        tg.requests.clear()
        stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=0.5))
        answer = "A long answer that keeps coming. " * 10
        stream.feed(answer[:60])
        await tg.wait_for_sent(1)
        tg.rate_limit_next("editMessageText", retry_after=retry_after)
        stream.feed(answer[60:120])
        await eventually(lambda: chat_budget_for("telegram", tg.token, "111", CHAT_RATE).paused,
                         timeout=5, what="the 429 seen")
        limited = tg.calls("editMessageText")[-1]
        stream.feed(answer[120:])  # arrives during the pause: the next edit carries it all
        delivery = await stream.finish(answer)
        assert delivery.ok
        assert [m.visible_text for m in tg.sent] == [check_html(markdown_to_html(answer))]
        limited_at = [r.at for r in tg.requests if r.method == "editMessageText"][0]
        after = [r for r in to_chat(tg) if r.at > limited_at]
        assert after and after[0].at - limited_at >= retry_after - ARRIVAL_JITTER, \
            f"nothing went to the chat during the {retry_after} s pause"
        assert len(tg.calls("sendMessage")) == 1, "never a duplicate message"
        assert limited["text"] != answer


@pytest.mark.slow  # 4 s measured under load: `make test-fast` leaves it out
async def test_a_9000_character_answer_with_code_becomes_several_messages_without_an_open_fence(tg, bot):
    adapter, _ = bot
    code = "\n".join(f"print('line {i:03d}')  # {'x' * 40}" for i in range(120))
    answer = "Intro.\n\n" + "words " * 300 + "\n\n```python\n" + code + "\n```\n\nAfter the code. " + "tail " * 100
    assert 8_500 < len(answer) < 10_000
    stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=0.3))
    await stream_words(stream, answer, every=0.01, size=120)
    delivery = await stream.finish(answer)
    assert delivery.ok and len(delivery.message_ids) == len(tg.sent) >= 3
    assert len({m.message_id for m in tg.sent}) == len(tg.sent)
    for message in tg.sent:
        assert utf16_len(message.visible_text) <= 4096
        assert message.parse_mode == "HTML", "every message ends formatted"
        assert message.text.count("<pre>") == message.text.count("</pre>")
    seen = "\n".join(m.visible_text for m in tg.sent)
    positions = [seen.index(f"line {i:03d}") for i in range(120)]
    assert positions == sorted(positions) and all(seen.count(f"line {i:03d}") == 1 for i in range(120))
    assert re.sub(r"\s+", " ", seen).strip().endswith("tail")


async def test_a_chat_gone_mid_stream_ends_quietly_as_a_failed_delivery(tg, bot):
    adapter, _ = bot
    stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=0.3))
    stream.feed("x" * 50)
    await tg.wait_for_sent(1)
    tg.fail_next("editMessageText", 5, status=403, description="Forbidden: bot was blocked by the user")
    stream.feed("y" * 50)
    await eventually(lambda: tg.calls("editMessageText"), what="the refused edit")
    delivery = await stream.finish("x" * 50 + "y" * 50)
    assert not delivery.ok and "blocked by the user" in delivery.error
    assert len(tg.calls("editMessageText")) == 1, "a refused chat is not written to again"


async def test_a_tool_status_line_is_replaced_by_the_answer(tg, bot):
    adapter, _ = bot
    stream = ReplyStream(adapter, DM, pacing=StreamPacing(edit_interval=0.3))
    stream.show_status("searching past sessions…")
    [status] = await tg.wait_for_sent(1)
    assert status.visible_text == "searching past sessions…"
    assert (await stream.finish("Found it: you chose PostgreSQL on Monday.")).ok
    assert [m.visible_text for m in tg.sent] == ["Found it: you chose PostgreSQL on Monday."]


# -- Discord and Slack: the same paths --------------------------------------------------------


def long_answer_with_code(lines: int) -> str:
    code = "\n".join(f"print('line {i:03d}')  # {'x' * 40}" for i in range(lines))
    return "Intro.\n\n" + "words " * 150 + "\n\n```python\n" + code + "\n```\n\nAfter the code. " + "tail " * 60


def assert_every_code_line_once_in_order(texts: list[str], lines: int) -> None:
    seen = "\n".join(texts)
    positions = [seen.index(f"line {i:03d}") for i in range(lines)]
    assert positions == sorted(positions) and all(seen.count(f"line {i:03d}") == 1 for i in range(lines))
    for text in texts:
        assert text.count("```") % 2 == 0, "no message leaves a code fence open"


@pytest.mark.slow  # 7 s measured under load: `make test-fast` leaves it out
async def test_discord_streams_a_long_answer_into_messages_within_the_limit(discord_fake, discord_bot):
    answer = long_answer_with_code(70)
    assert 5_000 < len(answer) < 6_500
    channel = discord_fake.general["id"]
    stream = ReplyStream(discord_bot, ChatRef("discord", channel), pacing=StreamPacing(edit_interval=0.3))
    await stream_words(stream, answer, every=0.01, size=100)
    delivery = await stream.finish(answer)
    messages = discord_fake.messages[channel]
    assert delivery.ok and delivery.message_ids == tuple(m["id"] for m in messages) and len(messages) >= 3
    assert all(len(m["content"]) <= 2000 for m in messages)
    assert any(m.get("edits") for m in messages), "edited in place, not sent again"
    assert_every_code_line_once_in_order([m["content"] for m in messages], 70)
    assert all(r.body.get("allowed_mentions", {}).get("parse") == [] for r in discord_fake.requests
               if r.method in ("POST", "PATCH") and "/messages" in r.path), "a stream never pings anyone"


async def test_discord_429_on_an_edit_pauses_the_channel_and_the_final_arrives_once(discord_fake, discord_bot):
    channel = discord_fake.general["id"]
    stream = ReplyStream(discord_bot, ChatRef("discord", channel), pacing=StreamPacing(edit_interval=0.3))
    answer = "Streaming along, one word after another. " * 6
    stream.feed(answer[:60])
    await discord_fake.wait_for_requests(lambda r: r.method == "POST" and r.path.endswith("/messages"))
    discord_fake.fail_next(1, status=429, retry_after=3, via=False, match=lambda r: r.method == "PATCH")
    stream.feed(answer[60:])
    [limited] = await discord_fake.wait_for_requests(lambda r: r.method == "PATCH")
    delivery = await stream.finish(answer)
    assert delivery.ok
    [message] = discord_fake.messages[channel]
    assert message["content"] == answer.rstrip()  # the final text as Discord shows it: no trailing space
    after = [r for r in discord_fake.requests if r.at > limited.at and f"/channels/{channel}/" in r.path]
    assert after and after[0].at - limited.at >= 3 - ARRIVAL_JITTER, "nothing to the channel during the pause"


async def test_slack_streams_with_chat_update_and_the_final_is_mrkdwn(running):
    fake, adapter, _ = running
    answer = "**Done.** The plan has three steps, and the _first_ is ready. " + "More detail follows. " * 5
    stream = ReplyStream(adapter, ChatRef("slack", "C1", "1700000000.000100"), pacing=StreamPacing(edit_interval=0.3))
    await stream_words(stream, answer, every=0.02, size=10)
    delivery = await stream.finish(answer)
    [posted] = fake.sent
    assert delivery.ok and delivery.message_ids == (next(iter(fake.posted)),)
    assert posted["thread_ts"] == "1700000000.000100" and posted["text"] == to_mrkdwn(answer)
    assert fake.updates, "updated in place"


async def test_slack_429_on_an_update_pauses_the_channel_and_the_final_arrives_once(running):
    fake, adapter, _ = running
    stream = ReplyStream(adapter, ChatRef("slack", "C1"), pacing=StreamPacing(edit_interval=0.3))
    answer = "Streaming along, one word after another. " * 6
    stream.feed(answer[:60])
    await fake.wait_for_calls("chat.postMessage", 1)
    fake.fail_next("chat.update", status=429, retry_after=3)
    stream.feed(answer[60:])
    await fake.wait_for_calls("chat.update", 1)
    limited = fake.calls_to("chat.update")[0]
    delivery = await stream.finish(answer)
    assert delivery.ok and [s["text"] for s in fake.sent] == [to_mrkdwn(answer)]
    after = [c for c in fake.calls if c.at > limited.at and c.body.get("channel") == "C1"]
    assert after and after[0].at - limited.at >= 3 - ARRIVAL_JITTER, "nothing to the channel during the pause"


async def test_slack_native_streaming_in_a_thread_appends_and_stops_the_stream(slack):
    async with started(slack, native_streaming=True) as (adapter, _):
        answer = "**Done.** The plan has three steps, and the _first_ is ready. " + "More detail follows. " * 5
        chat = ChatRef("slack", "C1", "1700000000.000100")
        stream = ReplyStream(adapter, chat, pacing=StreamPacing(edit_interval=0.3))
        await stream_words(stream, answer, every=0.02, size=10)
        delivery = await stream.finish(answer)
        [message] = slack.sent
        assert delivery.ok and message["text"] == answer and message["streaming"] is False
        assert slack.calls_to("chat.startStream") and slack.calls_to("chat.appendStream")
        assert len(slack.calls_to("chat.stopStream")) == 1
        assert slack.calls_to("chat.update") == [] and slack.calls_to("chat.postMessage") == []


async def test_slack_a_natively_streamed_approval_request_ends_with_its_buttons_in_the_same_message(slack):
    from gateway.approvals import buttons_for

    async with started(slack, native_streaming=True) as (adapter, _):
        chat = ChatRef("slack", "C1", "1700000000.000100")
        stream = ReplyStream(adapter, chat, pacing=StreamPacing(edit_interval=0.3))
        stream.show_status("using ledger__append…")
        await slack.wait_for_calls("chat.startStream", 1)
        request = "Approval needed: **ledger__append** wants to run (request ab12cd34). Approve runs it once."
        delivery = await stream.finish(request, buttons=buttons_for("ab12cd34"))
        [message] = slack.sent
        assert delivery.ok and message["streaming"] is False  # the stream stopped, then updated with its blocks
        assert slack.button_values(message) == ["/approve ab12cd34", "/deny ab12cd34"]
        assert message["blocks"][0]["text"]["text"] == to_mrkdwn(request) == message["text"]
        assert slack.calls_to("chat.postMessage") == []


async def test_slack_without_the_streaming_methods_falls_back_to_chat_update_and_stays_there(slack):
    async with started(slack, native_streaming=True) as (adapter, _):
        slack.error_next("chat.startStream", "unknown_method")
        chat = ChatRef("slack", "C1", "1700000000.000100")
        answer = "Streaming along, one word after another. " * 4
        for _ in range(2):
            stream = ReplyStream(adapter, chat, pacing=StreamPacing(edit_interval=0.3))
            await stream_words(stream, answer, every=0.02, size=12)
            assert (await stream.finish(answer)).ok
        assert [m["text"] for m in slack.sent] == [to_mrkdwn(answer)] * 2, "each reply once, in full"
        assert len(slack.calls_to("chat.startStream")) == 1, "not tried again after it failed"
