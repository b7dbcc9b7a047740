"""The Discord adapter's outbound side and slash commands, on the real discord.py against the fake Discord."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from adapters.discord import DiscordAdapter, DiscordConfig
from adapters.discord.format import to_discord, to_plain
from gateway.retry import Backoff
from gateway.types import ChatRef, ChatType, Delivery
from tests.fakes.discord import FakeDiscord, Request
from tests.harness import eventually
from tests.recording import Recorder, plain_fallbacks_in_metrics

COMMANDS = [("help", "Show commands"), ("new", "Start a fresh session"), ("title", "Show or set this session's title")]
FAST = Backoff(base=0.02, factor=2.0, cap=0.2)


@pytest.fixture
async def fake():
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def bot(fake):
    config = DiscordConfig(token=fake.token, api_base_url=fake.api_base_url, gateway_url=fake.gateway_url)
    adapter = DiscordAdapter(config, commands=COMMANDS, connect_timeout_seconds=5, send_backoff=FAST, reconnect_backoff=FAST, deliver_backoff=FAST)
    handler = Recorder()
    await adapter.start(handler)
    yield adapter, handler
    await adapter.stop()


def sends(fake: FakeDiscord) -> list[Request]:
    return [r for r in fake.requests if r.method == "POST" and r.path.endswith("/messages")]


# -- splitting and formatting -------------------------------------------------------------


@pytest.mark.slow  # 7 s measured under load: `make test-fast` leaves it out
async def test_a_10000_character_reply_with_code_is_split_into_valid_parts(fake, bot):
    adapter, _ = bot
    code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(120))
    prose = " ".join(f"word{i}" for i in range(700))
    text = f"Here is the plan.\n\n{prose}\n\n```python\n{code}\n```\n\nDone."
    assert len(text) > 10_000
    chat = ChatRef("discord", fake.general["id"])
    delivery = await adapter.send(chat, text)
    posted = [m["content"] for m in fake.messages[fake.general["id"]]]
    assert delivery.ok and len(delivery.message_ids) == len(posted) >= 6
    assert all(len(p) <= 2000 for p in posted)
    for part in posted:  # every part renders on its own: fences balanced
        assert part.count("```") % 2 == 0, part[-80:]
    joined = "\n".join(posted)
    assert all(f"value_{i} = compute({i})" in joined for i in range(120))
    assert all(f"word{i}" in joined for i in range(700))
    assert posted[0].startswith("Here is the plan.") and posted[-1].endswith("Done.")
    assert delivery.message_ids == tuple(m["id"] for m in fake.messages[fake.general["id"]])


async def test_replies_never_ping_everyone_or_roles(fake, bot):
    adapter, _ = bot
    await adapter.send(ChatRef("discord", fake.general["id"]), "@everyone look <@&123>")
    [req] = sends(fake)
    assert req.body["allowed_mentions"] == {"parse": [], "replied_user": True}


async def test_channel_reply_references_the_question_dm_reply_does_not(fake, bot):
    adapter, handler = bot
    q = await fake.channel_message(fake.general, fake.bob, f"{fake.mention(fake.bot)} q?", mentions=(fake.bot,))
    d = await fake.dm(fake.alice, "dm q?")
    in_channel, in_dm = await handler.wait_for(2)
    assert (await adapter.send(in_channel.chat, "a", reply_to=in_channel.message_id)).ok
    assert (await adapter.send(in_dm.chat, "b", reply_to=in_dm.message_id)).ok
    channel_req, dm_req = sends(fake)
    assert channel_req.path == f"/channels/{fake.general['id']}/messages"
    assert channel_req.body["message_reference"] == {
        "type": 0, "message_id": int(q["id"]), "channel_id": int(fake.general["id"]), "fail_if_not_exists": False}
    assert dm_req.path == f"/channels/{d['channel_id']}/messages"
    assert "message_reference" not in dm_req.body


async def test_thread_reply_goes_into_the_thread(fake, bot):
    adapter, _ = bot
    delivery = await adapter.send(ChatRef("discord", fake.general["id"], fake.thread["id"]), "in thread")
    assert delivery.ok
    assert [m["content"] for m in fake.messages[fake.thread["id"]]] == ["in thread"]
    assert fake.general["id"] not in fake.messages


async def test_markdown_discord_cannot_render_is_rewritten(fake, bot):
    adapter, _ = bot
    md = "#### Totals\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n---\n![chart](https://x.test/c.png) **ok**"
    await adapter.send(ChatRef("discord", fake.general["id"]), md)
    [req] = sends(fake)
    # the rule is left out (one blank line between the blocks, not the blank line the rule used to become as well)
    assert req.body["content"] == "**Totals**\n\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n```\n\n[chart](https://x.test/c.png) **ok**"


async def test_refused_formatting_is_resent_as_plain_text(fake, bot):
    adapter, _ = bot
    fake.fail_next(1, status=400, code=50035, message="Invalid Form Body")
    before = plain_fallbacks_in_metrics("discord")
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "**Bold** and [a link](https://x.test)")
    assert delivery.ok
    assert [r.body["content"] for r in sends(fake)] == ["**Bold** and [a link](https://x.test)",
                                                         "Bold and a link (https://x.test)"]
    assert [m["content"] for m in fake.messages[fake.general["id"]]] == ["Bold and a link (https://x.test)"]
    assert plain_fallbacks_in_metrics("discord") == before + 1, "the fallback is counted in /metrics"


def test_format_helpers_leave_code_alone():
    md = "```\n#### not a heading\n| a | b |\n|---|---|\n```"
    assert to_discord(md) == md
    assert to_plain("# Title\n\n```py\nx = 1\n```\n*it* `c`") == "Title\n\nx = 1\n\nit c"


# -- rate limits and failures -------------------------------------------------------------


async def test_a_429_once_then_the_reply_arrives_once(fake, bot):
    adapter, _ = bot
    fake.fail_next(1, status=429, retry_after=0.05)  # with Via: discord.py waits it out itself
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "hello")
    assert delivery.ok
    assert len(sends(fake)) == 2
    assert [m["content"] for m in fake.messages[fake.general["id"]]] == ["hello"]


async def test_a_429_holds_every_send_on_the_token_for_retry_after(fake, bot, caplog):
    caplog.set_level(logging.INFO, logger="adapters.discord")
    adapter, _ = bot
    other = fake.add_text_channel(fake.guild, "random")
    fake.fail_next(1, status=429, retry_after=0.3, match=lambda r: r.path == f"/channels/{fake.general['id']}/messages")
    first = asyncio.create_task(adapter.send(ChatRef("discord", fake.general["id"]), "one"))
    [limited] = await fake.wait_for_requests(lambda r: r.method == "POST")
    await eventually(lambda: "pausing every send on this bot token" in caplog.text, what="the 429 seen")
    second = await adapter.send(ChatRef("discord", other["id"]), "two")  # another channel, same token
    assert (await first).ok and second.ok
    [to_other] = [r for r in sends(fake) if r.path == f"/channels/{other['id']}/messages"]
    assert to_other.at - limited.at >= 0.3, "the other channel's send waited out the 429 too"


async def test_a_429_without_via_pauses_our_limiter_and_is_retried(fake, bot):
    adapter, _ = bot
    fake.fail_next(1, status=429, retry_after=0.2, via=False)  # discord.py raises it: our retry loop's job
    loop = asyncio.get_running_loop()
    started = loop.time()
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "hello")
    assert delivery.ok and len(sends(fake)) == 2
    assert loop.time() - started >= 0.2, "the retry waited for retry_after"
    assert [m["content"] for m in fake.messages[fake.general["id"]]] == ["hello"]


async def test_a_send_that_keeps_failing_is_a_failed_delivery_not_an_exception(fake, bot):
    adapter, _ = bot
    fake.fail_next(10, status=403, code=50013, message="Missing Permissions")
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "hello")
    assert delivery == Delivery(ok=False, error="Forbidden: 403 Forbidden (error code: 50013): Missing Permissions")
    assert len(sends(fake)) == 1, "a 403 is not retried"


async def test_server_errors_are_retried_with_the_same_nonce(fake, bot):
    adapter, _ = bot
    fake.fail_next(2, status=503)
    delivery = await adapter.send(ChatRef("discord", fake.general["id"]), "hello")
    assert delivery.ok
    reqs = sends(fake)
    assert len(reqs) == 3 and len({r.body["nonce"] for r in reqs}) == 1
    assert all(r.body["enforce_nonce"] for r in reqs)


async def test_send_before_start_and_empty_replies_fail_cleanly(fake, bot):
    adapter, _ = bot
    assert await adapter.send(ChatRef("discord", fake.general["id"]), "   ") == Delivery(
        ok=False, error="nothing to send: the reply is empty")
    idle = DiscordAdapter(DiscordConfig(token=fake.token))
    assert (await idle.send(ChatRef("discord", "1"), "x")).ok is False


async def test_typing_indicator(fake, bot):
    adapter, _ = bot
    await adapter.send_typing(ChatRef("discord", fake.general["id"], fake.thread["id"]))
    await fake.wait_for_requests(lambda r: r.path == f"/channels/{fake.thread['id']}/typing")


# -- slash commands -----------------------------------------------------------------------


async def test_slash_command_is_deferred_handed_over_and_answered_by_follow_up(fake, bot):
    adapter, handler = bot
    handler.gate = asyncio.Event()  # the gateway is still persisting...
    interaction = await fake.slash_command("title", fake.bob, args=" Trip planning ", channel=fake.general)
    [callback] = await fake.wait_for_requests(lambda r: r.path.startswith("/interactions/"))
    # ...and Discord already has its answer within the 3 s rule.
    assert callback.path == f"/interactions/{interaction['id']}/{interaction['token']}/callback"
    assert callback.body == {"type": 5}
    handler.gate.set()
    [msg] = await handler.wait_for(1)
    assert (msg.platform, msg.chat_type, msg.chat_id, msg.thread_id, msg.user_id, msg.user_name, msg.text,
            msg.message_id, msg.addressed) == (
        "discord", ChatType.CHANNEL, fake.general["id"], None, fake.bob["id"], "Bob", "/title Trip planning",
        interaction["id"], True)
    delivery = await adapter.send(msg.chat, "Title set.", reply_to=msg.message_id)
    assert delivery.ok
    [followup] = fake.followups
    assert followup["content"] == "Title set." and followup["interaction_token"] == interaction["token"]
    assert delivery.message_ids == (followup["id"],)
    assert sends(fake) == [], "nothing went to the channel"


async def test_slash_command_in_a_dm_without_args(fake, bot):
    _, handler = bot
    interaction = await fake.slash_command("new", fake.alice)
    [msg] = await handler.wait_for(1)
    assert (msg.chat_type, msg.chat_id, msg.text, msg.message_id) == (
        ChatType.DM, fake.alice["dm_channel_id"], "/new", interaction["id"])


async def test_slash_command_in_a_thread(fake, bot):
    _, handler = bot
    await fake.slash_command("help", fake.alice, channel=fake.thread)
    [msg] = await handler.wait_for(1)
    assert (msg.chat_type, msg.chat_id, msg.thread_id, msg.text) == (
        ChatType.THREAD, fake.general["id"], fake.thread["id"], "/help")


async def test_expired_interaction_token_falls_back_to_the_channel(fake, bot):
    adapter, handler = bot
    interaction = await fake.slash_command("help", fake.bob, channel=fake.general)
    [msg] = await handler.wait_for(1)
    fake.expired_tokens.add(interaction["token"])
    delivery = await adapter.send(msg.chat, "x" * 2500, reply_to=msg.message_id)
    assert delivery.ok and len(delivery.message_ids) == 2
    assert "".join(m["content"] for m in fake.messages[fake.general["id"]]) == "x" * 2500
    follow_up_attempts = [r for r in fake.requests if r.path.startswith("/webhooks/")]
    assert len(follow_up_attempts) == 1, "the expired token is tried once, not for every part"


async def test_a_command_the_gateway_cannot_take_tells_the_user(fake, bot):
    _, handler = bot
    handler.fail_times = 4  # every attempt
    await fake.slash_command("new", fake.alice)
    [followup] = (await fake.wait_for_sent(1))
    assert followup["content"] == "Sorry, that command could not be processed. Please try again."
    assert followup["request"]["flags"] == 64, "ephemeral: only the user sees it"


# -- config -------------------------------------------------------------------------------


def test_from_config_maps_the_discord_section():

    cfg = DiscordConfig(token="t0k", api_base_url="http://127.0.0.1:9/api/v10", gateway_url="ws://127.0.0.1:9/gw",
                        require_mention=False, free_response_channels=("42",), stall_timeout_seconds=60)
    adapter = DiscordAdapter.from_config(cfg, commands=COMMANDS, vision=True)
    assert (adapter.api_base_url, adapter.gateway_url, adapter.require_mention, adapter.free_response_channels,
            adapter.stall_timeout_seconds, adapter.vision, adapter.commands) == (
        "http://127.0.0.1:9/api/v10", "ws://127.0.0.1:9/gw", False, frozenset({"42"}), 60.0, True,
        tuple(COMMANDS))
    default = DiscordAdapter.from_config(DiscordConfig(token="t0k"), commands=(), vision=False)
    assert default.gateway_url == "wss://gateway.discord.gg/"
    assert re.fullmatch(r"https://discord\.com/api/v10", default.api_base_url)
