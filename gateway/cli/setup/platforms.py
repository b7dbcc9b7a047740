"""`switchboard setup`, the platforms: each token checked at once, and the owner found by a message.

The checks are the platforms' own "who am I" calls (Telegram ``getMe``, Discord ``/users/@me``,
Slack ``auth.test``), on the API base URLs the written config reads too (``TELEGRAM_BASE_URL``,
``DISCORD_API_BASE_URL``, ``SLACK_API_BASE_URL``: a local Bot API server, or a test's fake).  A
platform installed as its own package is listed by name, to be set in the config by hand.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

import aiohttp

from gateway.modelprobe import why_failed

from .ask import Ask, SetupFailed

TIMEOUT = aiohttp.ClientTimeout(total=15)
OWNER_WAIT_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Secret:
    variable: str  # what the env file holds and the config names as ${VARIABLE}
    question: str
    prefix: str = ""  # what a good value starts with (xoxb-, xapp-)


@dataclass(frozen=True, slots=True)
class PlatformGuide:
    name: str
    title: str
    how: tuple[str, str]  # the two lines shown before the token is asked for
    secrets: tuple[Secret, ...]
    check: Callable[[dict[str, str]], Coroutine[Any, Any, str]]  # the tokens -> who the bot is; raises SetupFailed
    base_variable: str
    base_default: str


@dataclass
class PlatformChoice:
    name: str
    values: dict[str, str]  # variable -> secret
    who: str  # "@switchboard_bot", from the check
    owner: str | None = None  # "<platform>:<user id>"
    extra: dict = field(default_factory=dict)


def _base(variable: str, default: str) -> str:
    return os.environ.get(variable) or default


async def _json(method: str, url: str, **kw) -> tuple[int, dict]:
    try:
        async with aiohttp.ClientSession(trust_env=False, timeout=TIMEOUT) as http:
            async with http.request(method, url, **kw) as r:
                body = await r.json(content_type=None) if r.content_type.endswith("json") else {}
                return r.status, body if isinstance(body, dict) else {}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        host = url.split("/")[2] if "//" in url else url
        raise SetupFailed(f"cannot reach {host}: {why_failed(exc)}") from None


TELEGRAM_BASE = ("TELEGRAM_BASE_URL", "https://api.telegram.org/bot")
DISCORD_BASE = ("DISCORD_API_BASE_URL", "https://discord.com/api/v10")
SLACK_BASE = ("SLACK_API_BASE_URL", "https://slack.com/api/")


async def check_telegram(values: dict[str, str]) -> str:
    status, body = await _json("POST", f"{_base(*TELEGRAM_BASE)}{values['TELEGRAM_BOT_TOKEN']}/getMe")
    if not body.get("ok"):
        raise SetupFailed(f"Telegram refused the token (HTTP {status}: {body.get('description', 'no description')}); "
                          "copy it again from @BotFather (/mybots -> your bot -> API Token)")
    return "@" + str(body["result"].get("username"))


async def check_discord(values: dict[str, str]) -> str:
    base = _base(*DISCORD_BASE).rstrip("/")
    status, body = await _json("GET", f"{base}/users/@me", headers={"Authorization": f"Bot {values['DISCORD_BOT_TOKEN']}"})
    if status != 200:
        raise SetupFailed(f"Discord refused the token (HTTP {status}); copy it again: Developer Portal -> your "
                          "application -> Bot -> Reset Token")
    return f"{body.get('username')} ({body.get('id')})"


async def check_slack(values: dict[str, str]) -> str:
    base = _base(*SLACK_BASE).rstrip("/")
    status, body = await _json("POST", f"{base}/auth.test", headers={"Authorization": f"Bearer {values['SLACK_BOT_TOKEN']}"})
    if not body.get("ok"):
        raise SetupFailed(f"Slack refused the bot token ({body.get('error', f'HTTP {status}')}); copy the Bot User "
                          "OAuth Token (xoxb-...) again: api.slack.com/apps -> your app -> OAuth & Permissions")
    if not values["SLACK_APP_TOKEN"].startswith("xapp-"):
        raise SetupFailed("the app-level token starts with xapp-: api.slack.com/apps -> your app -> Basic "
                          "Information -> App-Level Tokens (scope connections:write)")
    return f"@{body.get('user')} in {body.get('team')}"


GUIDES: dict[str, PlatformGuide] = {
    "telegram": PlatformGuide(
        "telegram", "Telegram",
        ("In Telegram, open @BotFather, send /newbot, pick a name and a username ending in 'bot'.",
         "BotFather answers with the bot's token (digits:letters): paste it here."),
        (Secret("TELEGRAM_BOT_TOKEN", "Telegram bot token"),), check_telegram, *TELEGRAM_BASE),
    "discord": PlatformGuide(
        "discord", "Discord",
        ("discord.com/developers/applications -> New Application -> Bot: Reset Token (copy it), and turn on "
         "Message Content Intent.",
         "Then OAuth2 -> URL Generator: scope bot, permissions Send Messages + Read Message History; open the URL "
         "to invite it."),
        (Secret("DISCORD_BOT_TOKEN", "Discord bot token"),), check_discord, *DISCORD_BASE),
    "slack": PlatformGuide(
        "slack", "Slack",
        ("api.slack.com/apps -> Create New App -> From scratch; Socket Mode: on (an app-level token with "
         "connections:write, xapp-...); Event Subscriptions: message.im, app_mention (docs/first-bot-slack.md).",
         "OAuth & Permissions: scopes chat:write, app_mentions:read, im:history, users:read; Install to "
         "Workspace; copy the Bot User OAuth Token (xoxb-...)."),
        (Secret("SLACK_BOT_TOKEN", "Slack bot token (xoxb-...)", "xoxb-"),
         Secret("SLACK_APP_TOKEN", "Slack app-level token (xapp-...)", "xapp-")), check_slack, *SLACK_BASE),
}


def choose_platforms(ask: Ask, installed: tuple[str, ...], given: dict[str, dict[str, str]]) -> list[PlatformChoice]:
    """Each platform the operator wants, its token checked at once; ``given``: the tokens passed as flags."""
    ask.section("2. The chat platforms")
    chosen: list[PlatformChoice] = []
    for name in installed:
        guide = GUIDES.get(name)
        if guide is None:  # a platform installed as its own package: its settings are its own
            ask.say(f"{name}: installed; set platforms.{name} in the config by hand (see its documentation)")
            continue
        values = dict(given.get(name, {}))
        if not values and not ask.confirm(f"Set up {guide.title}?", default=name == "telegram" and ask.interactive):
            continue
        if not values:
            ask.say(guide.how[0])
            ask.say(guide.how[1])
        while True:
            for secret in guide.secrets:
                if secret.variable not in values:
                    values[secret.variable] = ask.secret(secret.question)
            try:
                who = asyncio.run(guide.check(values))
                break
            except SetupFailed as exc:
                ask.bad(str(exc))
                if not ask.interactive:
                    raise
                values = {}
        ask.ok(f"{guide.title}: the token works ({who})")
        chosen.append(PlatformChoice(name, values, who))
    if not chosen:
        ask.say("No platform: the local API (curl, `switchboard chat`) still answers.")
    return chosen


# -- the owner -----------------------------------------------------------------------------------------

async def _telegram_first_dm(token: str, wait: float) -> tuple[dict, int] | None:
    """The first private message sent to the bot from now on, and its update id (None: none in time)."""
    base = f"{_base(*TELEGRAM_BASE)}{token}"
    _status, pending = await _json("POST", f"{base}/getUpdates", json={"timeout": 0})
    offset = max((u["update_id"] for u in pending.get("result", [])), default=-1) + 1  # what came before is not it
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        poll = max(1, min(10, int(deadline - time.monotonic())))
        try:
            async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=poll + 10)) as http:
                async with http.post(f"{base}/getUpdates", json={"offset": offset, "timeout": poll}) as r:
                    body = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            await asyncio.sleep(1)
            continue
        for update in body.get("result", []) if isinstance(body, dict) else []:
            offset = update["update_id"] + 1
            message = update.get("message") or {}
            if (message.get("chat") or {}).get("type") == "private" and message.get("from"):
                return message, update["update_id"]
    return None


async def _telegram_confirm(token: str, update_id: int) -> None:
    """Tell Telegram the owner's message is handled, so the daemon does not answer it later."""
    await _json("POST", f"{_base(*TELEGRAM_BASE)}{token}/getUpdates", json={"offset": update_id + 1, "timeout": 0})


async def _telegram_send(token: str, chat_id: int, text: str) -> None:
    await _json("POST", f"{_base(*TELEGRAM_BASE)}{token}/sendMessage", json={"chat_id": chat_id, "text": text})


GREETING = ("Hello {name}! You are this Switchboard's owner now: I answer you here once the gateway runs "
            "(make run, or switchboard service install).")


async def _discord_app_owner(token: str) -> dict | None:
    """The account that owns the bot's application in the Developer Portal (a team's owner for a team app)."""
    base = _base(*DISCORD_BASE).rstrip("/")
    status, app = await _json("GET", f"{base}/oauth2/applications/@me", headers={"Authorization": f"Bot {token}"})
    if status != 200:
        return None
    team = app.get("team") or {}
    if team.get("owner_user_id"):
        member = next((m.get("user") for m in team.get("members", []) if (m.get("user") or {}).get("id") == team["owner_user_id"]), None)
        return member or {"id": team["owner_user_id"]}
    owner = app.get("owner")
    return owner if isinstance(owner, dict) and owner.get("id") else None


async def _slack_member(token: str, member_id: str) -> dict | None:
    base = _base(*SLACK_BASE).rstrip("/")
    _status, body = await _json("POST", f"{base}/users.info", headers={"Authorization": f"Bearer {token}"},
                                data={"user": member_id})
    return body.get("user") if body.get("ok") else None


def _telegram_owner(ask: Ask, telegram: PlatformChoice, wait: float) -> str | None:
    token = telegram.values["TELEGRAM_BOT_TOKEN"]
    ask.say(f"Send any message to {telegram.who} now, from your own Telegram account (waiting {wait:.0f} s) …")
    found = asyncio.run(_telegram_first_dm(token, wait))
    if found is None:
        ask.bad("no message came; strangers get a pairing code instead (switchboard pairing approve ...)")
        return None
    message, update_id = found
    sender = message["from"]
    name = " ".join(p for p in (sender.get("first_name"), sender.get("last_name")) if p) or str(sender["id"])
    handle = f" (@{sender['username']})" if sender.get("username") else ""
    text = str(message.get("text", ""))[:80]
    ask.say(f'A message from {name}{handle}, Telegram id {sender["id"]}: "{text}"')
    asyncio.run(_telegram_confirm(token, update_id))
    if not ask.confirm("Make this account the owner (allowed, and approves tools)?", default=True):
        return None
    asyncio.run(_telegram_send(token, message["chat"]["id"], GREETING.format(name=sender.get("first_name") or name)))
    ask.ok(f"owner: telegram:{sender['id']}, greeted")
    return f"telegram:{sender['id']}"


def _discord_owner(ask: Ask, discord: PlatformChoice) -> str | None:
    """Discord sends a bot's DMs only over its gateway, so the owner is the application's, as the portal says."""
    owner = asyncio.run(_discord_app_owner(discord.values["DISCORD_BOT_TOKEN"]))
    if owner is None:
        ask.bad("Discord did not say who owns the application; pass --owner discord:YOUR_ID "
                "(Discord: Settings -> Advanced -> Developer Mode, then right-click yourself -> Copy User ID)")
        return None
    name = owner.get("global_name") or owner.get("username") or owner["id"]
    ask.say(f"The application's owner in the Developer Portal: {name}, Discord id {owner['id']}")
    if not ask.confirm("Make this account the owner (allowed, and approves tools)?", default=True):
        return None
    ask.ok(f"owner: discord:{owner['id']}")
    return f"discord:{owner['id']}"


def _slack_owner(ask: Ask, slack: PlatformChoice) -> str | None:
    """Slack's member id, asked for and looked up, so a typo is caught here and not at the first DM."""
    while True:
        member_id = ask.text("Your Slack member ID (your profile -> ⋮ -> Copy member ID; empty: none)", default="").strip()
        if not member_id:
            return None
        member = asyncio.run(_slack_member(slack.values["SLACK_BOT_TOKEN"], member_id))
        if member is not None:
            break
        ask.bad(f"Slack knows no member {member_id} in this workspace; it looks like U01ABCDEF")
    name = (member.get("profile") or {}).get("display_name") or member.get("real_name") or member.get("name") or member_id
    ask.say(f"Slack member {member_id}: {name}")
    if not ask.confirm("Make this account the owner (allowed, and approves tools)?", default=True):
        return None
    ask.ok(f"owner: slack:{member_id}")
    return f"slack:{member_id}"


def find_owner(ask: Ask, chosen: list[PlatformChoice], *, owner: str | None, wait: float) -> str | None:
    """The owner's ``platform:user_id``: given; or on Telegram the first account that messages the bot during
    setup, on Discord the application's owner, on Slack the member id the operator gives (looked up)."""
    ask.section("3. The owner")
    if owner:
        ask.ok(f"owner: {owner}")
        return owner
    by_name = {c.name: c for c in chosen}
    if not ask.interactive or not by_name.keys() & {"telegram", "discord", "slack"}:
        ask.say("No owner set: strangers get a pairing code (switchboard pairing approve PLATFORM CODE).")
        return None
    if "telegram" in by_name:
        return _telegram_owner(ask, by_name["telegram"], wait)
    if "discord" in by_name:
        return _discord_owner(ask, by_name["discord"])
    return _slack_owner(ask, by_name["slack"])
