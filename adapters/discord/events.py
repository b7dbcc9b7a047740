"""Discord messages and slash commands to :class:`~gateway.types.InboundMessage`.

Mapping (chat_id / thread_id):

* a DM channel is ``ChatType.DM`` with the DM channel's id;
* a guild text (or voice/stage text) channel is ``ChatType.CHANNEL`` with the
  channel's id (the gateway keeps one session per user there);
* a thread (including a forum post) is ``ChatType.THREAD`` with
  ``chat_id`` = the parent channel's id and ``thread_id`` = the thread's id;
* a group DM (user accounts only, kept for completeness) is ``ChatType.GROUP``.

Addressed means: a DM, a mention of the bot (``<@id>``, ``<@!id>`` or the
bot's managed role), a reply to one of the bot's messages, a ``/command`` the
gateway knows, a channel (or a thread's parent) listed in
``free_response_channels``, or ``require_mention=False``.  Guild messages that
are not addressed are dropped here, so is everything written by a bot
(this one included) and system messages (pins, joins, thread created...).

The text is what the user saw: the bot's own mention removed, other users'
``<@id>`` shown as ``@Name`` and ``<#id>`` as ``#channel`` where known.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import discord

from gateway.types import Attachment, ChatType, InboundMessage, clean_text

log = logging.getLogger(__name__)

PLATFORM = "discord"
_USER_TEXT_TYPES = (discord.MessageType.default, discord.MessageType.reply)


@dataclass(frozen=True, slots=True)
class Addressing:
    """Who the bot is and when it answers in guild channels."""

    bot_id: int
    require_mention: bool = True
    free_response_channels: frozenset[str] = frozenset()
    command_names: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Where:
    """A channel's place in the session model."""

    chat_type: ChatType
    chat_id: str
    thread_id: str | None = None


def where(channel: object) -> Where | None:
    """Where ``channel`` sits; None for a channel whose kind is unknown (resolve it first)."""
    if isinstance(channel, discord.DMChannel):
        return Where(ChatType.DM, str(channel.id))
    if isinstance(channel, discord.Thread):
        return Where(ChatType.THREAD, str(channel.parent_id), str(channel.id))
    if isinstance(channel, discord.GroupChannel):
        return Where(ChatType.GROUP, str(channel.id))
    if isinstance(channel, (discord.TextChannel, discord.VoiceChannel, discord.StageChannel)):
        return Where(ChatType.CHANNEL, str(channel.id))
    return None


def strip_mentions(text: str, user_id: int, role_ids: tuple[int, ...] = ()) -> str:
    """``text`` without mentions of the bot (user or managed role), whitespace tidied."""
    pattern = rf"<@!?{user_id}>"
    for role_id in role_ids:
        pattern += rf"|<@&{role_id}>"
    text = re.sub(pattern, " ", text)
    text = re.sub(r"[ \t]{2,}", " ", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()


def readable_mentions(message: discord.Message, text: str) -> str:
    """Other users' ``<@id>`` as ``@Name`` and ``<#id>`` as ``#channel`` where known (what the user saw)."""
    names = {user.id: user.display_name for user in message.mentions}

    def user(m: re.Match) -> str:
        name = names.get(int(m.group(1)))
        return f"@{name}" if name else m.group(0)

    def channel(m: re.Match) -> str:
        found = message.guild.get_channel_or_thread(int(m.group(1))) if message.guild else None
        return f"#{found.name}" if found is not None else m.group(0)

    return re.sub(r"<#(\d+)>", channel, re.sub(r"<@!?(\d+)>", user, text))


def _mentions_bot(message: discord.Message, bot_id: int, role_ids: tuple[int, ...]) -> bool:
    # message.mentions, not mentioned_in(): @everyone must not count as addressing the bot.
    if any(user.id == bot_id for user in message.mentions):
        return True
    return any(role.id in role_ids for role in message.role_mentions) or any(
        rid in role_ids for rid in message.raw_role_mentions
    )


def _replies_to_bot(message: discord.Message, bot_id: int) -> bool:
    ref = message.reference
    if ref is None:
        return False
    resolved = ref.resolved if ref.resolved is not None else ref.cached_message
    return isinstance(resolved, discord.Message) and resolved.author.id == bot_id


def _is_command(text: str, names: frozenset[str]) -> bool:
    if not text.startswith("/"):
        return False
    word = text[1:].split(maxsplit=1)[0] if len(text) > 1 else ""
    return word.lower() in names


def bot_role_ids(message: discord.Message) -> tuple[int, ...]:
    """The bot's managed role in this guild (mentioning it addresses the bot), if any."""
    guild = message.guild
    role = guild.self_role if guild is not None else None
    return (role.id,) if role is not None else ()


def ignore_reason(message: discord.Message, bot_id: int) -> str | None:
    """Why this message is never handed to the gateway, or None."""
    if message.author.id == bot_id:
        return "own message"
    if message.author.bot or message.webhook_id is not None:
        return "from a bot"
    if message.type not in _USER_TEXT_TYPES:
        return f"system message ({message.type.name})"
    return None


def from_message(
    message: discord.Message,
    place: Where,
    addressing: Addressing,
    *,
    attachments: tuple[Attachment, ...] = (),
) -> InboundMessage | None:
    """The normalized message, or None when it is not for the bot (logged at debug)."""
    reason = ignore_reason(message, addressing.bot_id)
    if reason:
        log.debug("discord message %s ignored: %s", message.id, reason)
        return None
    roles = bot_role_ids(message)
    text = readable_mentions(message, strip_mentions(clean_text(message.content), addressing.bot_id, roles))
    addressed = (
        place.chat_type is ChatType.DM
        or not addressing.require_mention
        or place.chat_id in addressing.free_response_channels
        or (place.thread_id is not None and place.thread_id in addressing.free_response_channels)
        or _mentions_bot(message, addressing.bot_id, roles)
        or _replies_to_bot(message, addressing.bot_id)
        or _is_command(text, addressing.command_names)
    )
    if not addressed:
        log.debug("discord message %s in %s dropped: not addressed to the bot", message.id, place.chat_id)
        return None
    author = message.author
    return InboundMessage(
        platform=PLATFORM,
        chat_type=place.chat_type,
        chat_id=place.chat_id,
        thread_id=place.thread_id,
        user_id=str(author.id),
        user_name=author.display_name,
        text=text,
        attachments=attachments,
        message_id=str(message.id),
        addressed=True,
    )


def from_command(interaction: discord.Interaction, place: Where, name: str, args: str | None) -> InboundMessage:
    """A slash command invocation as ``/<name> <args>`` (always addressed)."""
    user = interaction.user
    text = f"/{name} {args.strip()}" if args and args.strip() else f"/{name}"
    return InboundMessage(
        platform=PLATFORM,
        chat_type=place.chat_type,
        chat_id=place.chat_id,
        thread_id=place.thread_id,
        user_id=str(user.id),
        user_name=user.display_name,
        text=text,
        message_id=str(interaction.id),
        addressed=True,
    )
