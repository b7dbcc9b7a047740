"""The Telegram adapter's outbound side (split, format, fallback, 429, errors) and webhook mode."""

from __future__ import annotations

import pytest

from adapters.telegram import TelegramAdapter
from adapters.telegram.format import markdown_to_html
from gateway.formatting import utf16_len
from gateway.types import ChatRef, ChatType
from tests.fakes.telegram import FakeTelegram, check_html
from tests.recording import plain_fallbacks_in_metrics
from tests.test_adapter_telegram import ANN, TEAM, Recorder, bot, make_adapter, tg  # noqa: F401 - bot, tg: fixtures

DM = ChatRef("telegram", "111")


async def test_markdown_is_sent_as_html_and_the_user_sees_clean_text(tg, bot):
    adapter, _ = bot
    delivery = await adapter.send(DM, "**Done** & *checked*: `a<b>` see [docs](https://ex.com/?a=1&b=2)")
    assert delivery.ok and delivery.error is None
    [sent] = tg.sent
    assert sent.parse_mode == "HTML"
    assert sent.text == ('<b>Done</b> &amp; <i>checked</i>: <code>a&lt;b&gt;</code> see '
                         '<a href="https://ex.com/?a=1&amp;b=2">docs</a>')
    assert sent.visible_text == "Done & checked: a<b> see docs"
    assert delivery.message_ids == (str(sent.message_id),)


def test_the_converter_output_is_html_telegram_accepts():
    samples = [
        "# Plan\n- step *one*\n- step **two**\n\n```python\nx = a < b and c > d\n```\n> quoted & done",
        "snake_case_name and 2*3*4 and __init__ stay as they are",
        "**bold with `code` inside** and [**bold link**](https://ex.com)",
        "```\nunclosed fence <tag>",
    ]
    for sample in samples:
        check_html(markdown_to_html(sample))  # raises like Telegram would
    assert check_html(markdown_to_html(samples[1])) == samples[1]


async def test_a_10000_character_reply_with_code_is_split_within_the_limit(tg, bot):
    adapter, _ = bot
    code = "\n".join(f"    print('line {i:04d}', '{'x' * 50}')" for i in range(100))
    text = "Intro paragraph.\n\n" + "word " * 300 + "\n\n```python\n" + code + "\n```\n\nDone " + "tail " * 200
    assert 9_000 < len(text) < 11_000
    delivery = await adapter.send(DM, text)
    assert delivery.ok and len(delivery.message_ids) == len(tg.sent) in (3, 4)  # cuts prefer paragraph ends
    assert all(utf16_len(s.visible_text) <= 4096 and s.parse_mode == "HTML" for s in tg.sent)
    # Every code line arrives once, in order, and the block is code in each part that holds some of it.
    seen = "\n".join(s.visible_text for s in tg.sent)
    positions = [seen.index(f"line {i:04d}") for i in range(100)]
    assert positions == sorted(positions)
    code_parts = [s for s in tg.sent if "line 0" in s.visible_text]
    assert len(code_parts) >= 2
    assert all('<pre><code class="language-python">' in s.text for s in code_parts)
    assert tg.sent[-1].visible_text.rstrip().endswith("tail")


async def test_splitting_counts_utf16_units_like_telegram(tg, bot):
    adapter, _ = bot
    delivery = await adapter.send(DM, "😀" * 3000)  # 3,000 characters, 6,000 UTF-16 units
    assert delivery.ok and len(tg.sent) == 2
    assert "".join(s.visible_text for s in tg.sent) == "😀" * 3000


async def test_a_429_pauses_and_the_reply_arrives_once(tg, bot):
    adapter, _ = bot
    tg.rate_limit_next("sendMessage", retry_after=1)
    delivery = await adapter.send(DM, "after the flood wait")
    assert delivery.ok
    assert [s.visible_text for s in tg.sent] == ["after the flood wait"]
    assert len(tg.calls("sendMessage")) == 2


async def test_rejected_formatting_is_resent_as_plain_text(tg, bot):
    adapter, _ = bot
    tg.fail_next("sendMessage", status=400, description="Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"b\"")
    before = plain_fallbacks_in_metrics("telegram")
    delivery = await adapter.send(DM, "**odd** <markup>")
    assert delivery.ok
    first, second = tg.calls("sendMessage")
    assert first["parse_mode"] == "HTML"
    assert "parse_mode" not in second and second["text"] == "**odd** <markup>"
    assert [s.visible_text for s in tg.sent] == ["**odd** <markup>"]
    assert plain_fallbacks_in_metrics("telegram") == before + 1, "the fallback is counted in /metrics"


async def test_a_send_the_platform_refuses_is_a_failed_delivery_not_an_exception(tg, bot):
    adapter, _ = bot
    tg.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
    delivery = await adapter.send(DM, "hello?")
    assert not delivery.ok and delivery.message_ids == ()
    assert "blocked by the user" in delivery.error and "part 1/1" in delivery.error
    assert tg.sent == []


@pytest.mark.slow  # 5 s measured under load: `make test-fast` leaves it out
async def test_server_errors_are_retried_then_reported(tg, bot):
    adapter, _ = bot
    tg.fail_next("sendMessage", 2, status=502, description="Bad Gateway")
    assert (await adapter.send(DM, "retried")).ok and [s.text for s in tg.sent] == ["retried"]
    tg.fail_next("sendMessage", 10, status=500, description="Internal Server Error")
    delivery = await adapter.send(DM, "gives up")
    assert not delivery.ok and "Internal Server Error" in delivery.error
    assert len(tg.sent) == 1


async def test_a_reply_to_a_group_that_became_a_supergroup_follows_it(tg, bot):
    adapter, _ = bot
    tg.fail_next("sendMessage", status=400, description="Bad Request: group chat was upgraded to a supergroup chat",
                 parameters={"migrate_to_chat_id": -1005550001})
    delivery = await adapter.send(ChatRef("telegram", "-4321"), "still here")
    assert delivery.ok
    assert [c["chat_id"] for c in tg.calls("sendMessage")] == [-4321, -1005550001]
    assert [(s.chat_id, s.visible_text) for s in tg.sent] == [(-1005550001, "still here")]


async def test_replies_in_a_topic_go_to_the_topic_and_quote_the_question(tg, bot):
    adapter, handler = bot
    tg.in_topic(TEAM, ANN, "@switchboard_bot status?", thread_id=77)
    [msg] = await handler.wait_for(1)
    assert msg.chat_type is ChatType.THREAD
    await adapter.send_typing(msg.chat)
    delivery = await adapter.send(msg.chat, "All green.", reply_to=msg.message_id)
    assert delivery.ok
    [sent] = tg.sent
    assert (sent.chat_id, sent.thread_id, sent.reply_to) == (-1001234567890, 77, int(msg.message_id))
    [typing] = tg.calls("sendChatAction")
    assert typing == {"chat_id": -1001234567890, "action": "typing", "message_thread_id": 77}


async def test_dm_replies_are_not_quoted(tg, bot):
    adapter, handler = bot
    tg.dm(ANN, "hi")
    [msg] = await handler.wait_for(1)
    await adapter.send(msg.chat, "hello", reply_to=msg.message_id)
    assert (tg.sent[0].chat_id, tg.sent[0].reply_to, tg.sent[0].thread_id) == (111, None, None)


async def test_send_before_start_or_after_stop_fails_cleanly(tg):
    adapter = make_adapter(tg)
    assert (await adapter.send(DM, "x")).error == "telegram adapter is not running"
    await adapter.send_typing(DM)  # best effort, no exception
    await adapter.stop()


# -- webhook mode ---------------------------------------------------------------------------


async def test_webhook_mode_refuses_bad_secrets_and_acknowledges_stored_updates(tg):
    adapter, handler = make_adapter(tg, webhook_url="https://bot.example.com/tg/hook", webhook_port=0,
                                    webhook_secret="s3cret-Value_1"), Recorder()
    await adapter.start(handler)
    try:
        assert tg.webhook["url"] == "https://bot.example.com/tg/hook"
        assert tg.webhook["secret_token"] == "s3cret-Value_1"
        assert tg.calls("getUpdates") == [] and tg.calls("deleteWebhook") == []
        assert adapter.health().detail == "@switchboard_bot (webhook)"
        url = adapter.webhook_local_url
        assert url.endswith("/tg/hook")

        update = {"update_id": 1, "message": tg.message(FakeTelegram.private_chat(ANN), ANN, "via webhook")}
        assert await tg.deliver_webhook(update, url, send_secret=False) == 403
        assert await tg.deliver_webhook(update, url, secret="wrong") == 403
        assert handler.messages == []

        assert await tg.deliver_webhook(update, url) == 200
        assert [m.text for m in handler.messages] == ["via webhook"]

        handler.fail_times = 1
        second = {"update_id": 2, "message": tg.message(FakeTelegram.private_chat(ANN), ANN, "again")}
        assert await tg.deliver_webhook(second, url) == 500  # Telegram will deliver it again
        assert await tg.deliver_webhook(second, url) == 200
        assert [m.text for m in handler.messages] == ["via webhook", "again"]
    finally:
        await adapter.stop()


async def test_webhook_mode_generates_a_secret_when_none_is_configured(tg):
    adapter, handler = make_adapter(tg, webhook_url="https://bot.example.com/hook", webhook_port=0), Recorder()
    await adapter.start(handler)
    try:
        secret = tg.webhook["secret_token"]
        assert len(secret) >= 32
        update = {"update_id": 1, "message": tg.message(FakeTelegram.private_chat(ANN), ANN, "hi")}
        assert await tg.deliver_webhook(update, adapter.webhook_local_url, secret="") == 403
        assert await tg.deliver_webhook(update, adapter.webhook_local_url) == 200
    finally:
        await adapter.stop()


async def test_from_config_builds_a_working_adapter(tg):
    from adapters.telegram import TelegramConfig

    cfg = TelegramConfig(token=tg.token, base_url=tg.base_url, require_mention=False, stall_timeout_seconds=60)
    adapter = TelegramAdapter.from_config(cfg, commands=[("help", "Show commands")], vision=True)
    handler = Recorder()
    await adapter.start(handler)
    try:
        tg.in_group(TEAM, ANN, "no mention needed here")
        [msg] = await handler.wait_for(1)
        assert msg.text == "no mention needed here"
        assert tg.commands == [{"command": "help", "description": "Show commands"}]
        assert adapter.health().detail == "@switchboard_bot (polling)"
    finally:
        await adapter.stop()


async def test_a_refused_webhook_fails_start_and_closes_the_endpoint(tg):
    from gateway.errors import AdapterError

    tg.fail_next("setWebhook", status=400, description="Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
    adapter = make_adapter(tg, webhook_url="http://insecure.example/hook", webhook_port=0)
    with pytest.raises(AdapterError, match="(?i)could not start webhook: .*https url must be provided"):
        await adapter.start(Recorder())
    assert adapter.health().state == "failed"
    assert adapter.webhook_local_url is None
