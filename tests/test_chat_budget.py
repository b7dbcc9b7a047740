"""One outbound budget per chat: sends and typing share it, and a 429 silences the whole chat.

Driven through the real client libraries against the fake platforms; the fakes record when
each call arrived, which is what the platform would count.
"""

from __future__ import annotations

import asyncio

import pytest

from adapters.discord import DiscordAdapter, DiscordConfig
from adapters.discord.outbound import CHANNEL_RATE as DISCORD_CHANNEL
from adapters.slack.adapter import CHANNEL_RATE as SLACK_CHANNEL
from adapters.telegram.adapter import CHAT_RATE as TELEGRAM_CHAT, GROUP_RATE as TELEGRAM_GROUP
from gateway.ratelimit import ChatRate, RateLimiter, chat_budget_for
from gateway.types import ChatRef
from tests.fakes.discord import FakeDiscord
from tests.harness import eventually
from tests.recording import Recorder
from tests.test_adapter_discord_send import COMMANDS as DISCORD_COMMANDS, FAST
from tests.test_adapter_slack import running, slack  # noqa: F401 - fixtures
from tests.test_adapter_telegram import bot, tg  # noqa: F401 - fixtures

DM = ChatRef("telegram", "111")
OTHER_DM = ChatRef("telegram", "222")
GAP = 0.25
ARRIVAL_JITTER = 0.08  # the fake stamps arrival, after our call left (up to ~80 ms on a loaded 2-core box); unpaced calls land ~1 ms apart


def _gaps(times: list[float]) -> list[float]:
    times = sorted(times)
    return [b - a for a, b in zip(times, times[1:], strict=False)]


# -- the budget itself --------------------------------------------------------------------


def test_a_paused_budget_lends_no_slot_to_a_best_effort_call():
    now = [100.0]
    budget = RateLimiter(rate=1.0, burst=2, clock=lambda: now[0])
    assert budget.try_acquire()
    budget.pause(40.0)
    assert budget.paused and not budget.try_acquire()
    now[0] += 39.9
    assert not budget.try_acquire()
    now[0] += 0.2
    assert budget.try_acquire(), "after the pause the slot is free again"


def test_calls_are_spaced_by_the_minimum_gap_even_within_a_burst():
    now = [0.0]
    budget = RateLimiter(rate=10.0, burst=5, min_gap=GAP, clock=lambda: now[0])
    assert budget.try_acquire()
    now[0] += GAP - 0.01
    assert not budget.try_acquire(), "a burst is left, but the gap is not over"
    now[0] += 0.01
    assert budget.try_acquire()


async def test_one_chat_is_one_budget_and_another_chat_is_another():
    rate = ChatRate(rate=1.0, burst=1)
    first = chat_budget_for("telegram", "token", "111", rate)
    assert chat_budget_for("telegram", "token", "111", rate) is first
    assert chat_budget_for("telegram", "token", "222", rate) is not first
    assert chat_budget_for("telegram", "other-token", "111", rate) is not first


# -- Telegram -----------------------------------------------------------------------------


async def test_telegram_replies_and_typing_to_one_chat_never_come_closer_than_a_quarter_second(tg, bot):
    adapter, _ = bot
    for text in ("one", "two", "three", "four"):
        await adapter.send_typing(DM)
        assert (await adapter.send(DM, text)).ok
    to_chat = [r.at for r in tg.requests if str(r.params.get("chat_id")) == "111"]
    assert len(tg.calls("sendMessage")) == 4
    assert min(_gaps(to_chat)) >= GAP - ARRIVAL_JITTER
    # About one call a second after a burst of two: four replies and whatever typing got a slot.
    assert max(to_chat) - min(to_chat) >= (len(to_chat) - 2) * 1.0 - ARRIVAL_JITTER


async def test_telegram_429_silences_the_chat_typing_included_and_the_reply_arrives_once(tg, bot):
    adapter, _ = bot
    tg.rate_limit_next("sendMessage", retry_after=2)
    reply = asyncio.create_task(adapter.send(DM, "after the flood wait"))
    [limited] = await tg.wait_for_calls("sendMessage", 1)
    await eventually(lambda: chat_budget_for("telegram", tg.token, "111", TELEGRAM_CHAT).paused, what="the 429 seen")
    for _ in range(3):
        await adapter.send_typing(DM)  # the router keeps the indicator going while it waits
        await adapter.send_typing(OTHER_DM)
    assert (await reply).ok
    assert [s.visible_text for s in tg.sent] == ["after the flood wait"]
    first, retried = [r for r in tg.requests if r.method == "sendMessage"]
    assert retried.at - first.at >= 2.0 - ARRIVAL_JITTER
    during = [r for r in tg.requests if first.at < r.at < retried.at]
    assert all(str(r.params.get("chat_id")) != "111" for r in during), "nothing went to the paused chat"
    assert [str(r.params["chat_id"]) for r in during if r.method == "sendChatAction"] == ["222"], \
        "another chat's typing is not held by this chat's pause"


# -- Discord ------------------------------------------------------------------------------


@pytest.fixture
async def discord_fake():
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def discord_bot(discord_fake):
    adapter = DiscordAdapter(DiscordConfig(token=discord_fake.token, api_base_url=discord_fake.api_base_url,
                                           gateway_url=discord_fake.gateway_url), commands=DISCORD_COMMANDS,
                             connect_timeout_seconds=5, send_backoff=FAST, reconnect_backoff=FAST, deliver_backoff=FAST)
    await adapter.start(Recorder())
    yield adapter
    await adapter.stop()


async def test_discord_429_silences_the_channel_typing_included(discord_fake, discord_bot):
    fake: FakeDiscord = discord_fake
    adapter = discord_bot
    general, other = fake.general["id"], fake.add_text_channel(fake.guild, "random")["id"]
    fake.fail_next(1, status=429, retry_after=1.0, via=False)  # ours to wait out, not discord.py's
    reply = asyncio.create_task(adapter.send(ChatRef("discord", general), "hello"))
    await fake.wait_for_requests(lambda r: r.method == "POST" and r.path.endswith("/messages"))
    await eventually(lambda: chat_budget_for("discord", fake.token, general, DISCORD_CHANNEL).paused,
                     what="the 429 seen")
    for _ in range(3):
        await adapter.send_typing(ChatRef("discord", general))
    await adapter.send_typing(ChatRef("discord", other))
    assert (await reply).ok
    first, retried = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    assert retried.at - first.at >= 1.0 - ARRIVAL_JITTER
    typing = [r.path for r in fake.requests if r.path.endswith("/typing")]
    assert typing == [f"/channels/{other}/typing"], "no typing to the paused channel; the other channel's went"


# -- Slack --------------------------------------------------------------------------------


async def test_slack_429_silences_the_channel_typing_reaction_included(running):
    fake, adapter, rec = running
    await fake.wait_for_ack(await fake.send_event(fake.message("D1", "U1", "first")))
    [msg] = await rec.wait_for(1)
    fake.fail_next("chat.postMessage", status=429, retry_after=1)
    reply = asyncio.create_task(adapter.send(msg.chat, "answer"))
    await fake.wait_for_calls("chat.postMessage", 1)
    await eventually(lambda: chat_budget_for("slack", fake.bot_token, "D1", SLACK_CHANNEL).paused, what="the 429 seen")
    await adapter.send_typing(msg.chat)
    assert (await reply).ok
    first, retried = fake.calls_to("chat.postMessage")
    assert retried.at - first.at >= 1.0 - ARRIVAL_JITTER
    assert fake.calls_to("reactions.add") == [], "no typing reaction while the channel was paused"
    assert [s["text"] for s in fake.sent] == ["answer"]


@pytest.mark.parametrize("rate, window, limit", [
    (TELEGRAM_GROUP, 60.0, 20),  # a Telegram group: 20 a minute
    (TELEGRAM_CHAT, 1.0, 3),  # a Telegram chat: about 1 a second, a burst of 2
    (DISCORD_CHANNEL, 5.0, 5),  # a Discord channel: 5 per 5 s
    (SLACK_CHANNEL, 1.0, 3),  # a Slack channel: about 1 a second, short bursts allowed
])
def test_the_default_budgets_fit_the_platforms_documented_windows(rate, window, limit):
    # A token bucket lets through at most burst + window x rate calls in any window.
    assert rate.burst + window * rate.rate <= limit + 1e-9
