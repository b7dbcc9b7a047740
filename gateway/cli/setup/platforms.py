"""`switchboard setup`, the platforms: each one's values checked at once, and the owner found.

Each platform's package says what to ask (``PlatformConfig.SETUP``, a :class:`gateway.types.SetupGuide`)
and how to check it: the same call ``switchboard doctor`` makes (``credential_check``: Telegram
``getMe``, Discord ``/users/@me``, Slack ``auth.test``; or ``probe``: email's IMAP and SMTP logins), on
the API address the written config reads too (``TELEGRAM_BASE_URL``, ``DISCORD_API_BASE_URL``,
``SLACK_API_BASE_URL``: a local Bot API server, or a test's fake).  A platform that says nothing is
listed by name, to be set in the config by hand.  Finding the owner is each platform's own way, below.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import aiohttp
from pydantic import ValidationError

from gateway.config import PlatformConfig, platform_models
from gateway.modelprobe import why_failed
from gateway.types import SetupGuide

from .ask import Ask, SetupFailed

TIMEOUT = aiohttp.ClientTimeout(total=15)
OWNER_WAIT_SECONDS = 300.0


@dataclass
class PlatformChoice:
    name: str
    guide: SetupGuide
    values: dict[str, str]  # variable -> the answer
    who: str  # "@switchboard_bot", from the check
    owner: str | None = None  # "<platform>:<user id>"
    extra: dict = field(default_factory=dict)

    def settings(self) -> dict[str, str]:
        """The platform's section as the config file holds it: secrets as ``${VARIABLE}``, the rest as typed,
        the API address read from its variable with the platform's default."""
        keys = {v.key: f"${{{v.variable}}}" if v.secret else self.values[v.variable] for v in self.guide.values}
        if self.guide.base_key:
            keys[self.guide.base_key] = f"${{{self.guide.base_variable}:-{_base_default(self.name)}}}"
        return keys

    def secrets(self) -> dict[str, str]:
        """What switchboard.env holds for this platform: variable -> secret."""
        return {v.variable: self.values[v.variable] for v in self.guide.values if v.secret}


def _base_default(platform: str) -> str:
    guide = platform_models()[platform].SETUP
    assert guide is not None and guide.base_key
    return str(platform_models()[platform].model_fields[guide.base_key].default)


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


def _api(platform: str) -> str:
    """The platform's API address as the written config will read it: its variable, else the default."""
    guide = platform_models()[platform].SETUP
    assert guide is not None and guide.base_key
    return _base(guide.base_variable, _base_default(platform))


def _section(name: str, guide: SetupGuide, values: dict[str, str]) -> PlatformConfig:
    """The platform's settings model as the written config will load it (the answers validated the same way)."""
    keys: dict[str, str] = {v.key: values[v.variable] for v in guide.values}
    if guide.base_key:
        keys[guide.base_key] = _api(name)
    try:
        return platform_models()[name].model_validate({"enabled": True, **keys})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "?"
        raise SetupFailed(f"platforms.{name}.{where}: {first.get('msg')}") from None


async def check_platform(name: str, guide: SetupGuide, values: dict[str, str]) -> tuple[str, str]:
    """Who the platform says the bot is, and what the check found, by the platform's own check
    (``credential_check``, else ``probe``); raises SetupFailed."""
    for v in guide.values:
        if v.prefix and not values[v.variable].startswith(v.prefix):
            raise SetupFailed(f"the {v.question.split(' (')[0]} starts with {v.prefix}: {v.where}")
    section = _section(name, guide, values)
    check = section.credential_check()
    if check is not None:
        status, body = await _json(check.method, check.url, headers=check.headers)
        who = check.who(status, body)
        if not who:
            said = body.get("description") or body.get("error") or body.get("message") or "no description"
            raise SetupFailed(f"{guide.title} refused the token (HTTP {status}: {said}); {guide.refused}")
        return str(who), f"the token works ({who})"
    try:
        found = await section.probe(TIMEOUT.total or 15.0)
    except Exception as exc:  # noqa: BLE001 - a platform's own check failing is a refusal, said so
        raise SetupFailed(f"{guide.title}: its check failed ({type(exc).__name__}); {guide.refused}") from None
    if found is None:
        return name, "not checked here; `switchboard doctor` checks it once the gateway runs"
    ok, detail, fix = found
    if not ok:
        raise SetupFailed(f"{guide.title}: {detail}; {fix or guide.refused}")
    return name, detail


def _ask_values(ask: Ask, guide: SetupGuide, values: dict[str, str]) -> None:
    for v in guide.values:
        if v.variable not in values:
            values[v.variable] = ask.secret(v.question) if v.secret else ask.text(v.question, v.default).strip()


def choose_platforms(ask: Ask, installed: tuple[str, ...], given: dict[str, dict[str, str]]) -> list[PlatformChoice]:
    """Each platform the operator wants, its values checked at once; ``given``: the tokens passed as flags.

    A platform's package says how it is set up (``PlatformConfig.SETUP``); one that says nothing is named,
    to be set in the config by hand."""
    ask.section("2. The chat platforms")
    chosen: list[PlatformChoice] = []
    for name in installed:
        guide = platform_models()[name].SETUP
        if guide is None:
            ask.say(f"{name}: installed; set platforms.{name} in the config by hand (see its documentation)")
            continue
        values = dict(given.get(name, {}))
        if not values and not ask.confirm(f"Set up {guide.title}?", default=name == "telegram" and ask.interactive):
            continue
        if not values:
            for line in guide.how:
                ask.say(line)
        while True:
            _ask_values(ask, guide, values)
            try:
                who, found = asyncio.run(check_platform(name, guide, values))
                break
            except SetupFailed as exc:
                ask.bad(str(exc))
                if not ask.interactive:
                    raise
                values = {}
        ask.ok(f"{guide.title}: {found}")
        chosen.append(PlatformChoice(name, guide, values, who))
    if not chosen:
        ask.say("No platform: the local API (curl, `switchboard chat`) still answers.")
    return chosen


# -- the owner -----------------------------------------------------------------------------------------

async def _telegram_first_dm(token: str, wait: float) -> tuple[dict, int] | None:
    """The first private message sent to the bot from now on, and its update id (None: none in time)."""
    base = f"{_api('telegram')}{token}"
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
    await _json("POST", f"{_api('telegram')}{token}/getUpdates", json={"offset": update_id + 1, "timeout": 0})


async def _telegram_send(token: str, chat_id: int, text: str) -> None:
    await _json("POST", f"{_api('telegram')}{token}/sendMessage", json={"chat_id": chat_id, "text": text})


GREETING = ("Hello {name}! You are this Switchboard's owner now: I answer you here once the gateway runs "
            "(make run, or switchboard service install).")


async def _discord_app_owner(token: str) -> dict | None:
    """The account that owns the bot's application in the Developer Portal (a team's owner for a team app)."""
    base = _api("discord").rstrip("/")
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
    base = _api("slack").rstrip("/")
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
