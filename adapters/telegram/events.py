"""Telegram messages to :class:`~gateway.types.InboundMessage` (everything but attachments).

Mapping: a private chat is a DM; a group or supergroup is a GROUP; a message
in a forum topic (``is_topic_message`` with ``message_thread_id``) is a THREAD
with that topic id; a channel post is a CHANNEL message without a user.

Addressed means: a DM, a mention of the bot (``@name`` or a text mention), a
reply to one of the bot's messages, a command for this bot, a chat listed in
``free_response_channels``, or ``require_mention=False``.  Group messages that
are not addressed are dropped here (the gateway answers whatever it gets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from telegram import CallbackQuery, Message, MessageEntity, User

from gateway.types import ChatType, InboundMessage, clean_text

log = logging.getLogger(__name__)

PLATFORM = "telegram"


@dataclass(frozen=True, slots=True)
class Addressing:
    """Who the bot is and when it answers in groups."""

    bot_id: int
    bot_username: str
    require_mention: bool = True
    free_response_channels: frozenset[str] = frozenset()


def _utf16_slice_remove(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the UTF-16 ``(offset, length)`` spans, whitespace at the seams tidied."""
    units = _utf16(text)
    pieces: list[str] = []
    pos = 0
    for offset, length in sorted(spans):
        pieces.append(_from_utf16(units[2 * pos : 2 * offset]))
        pos = offset + length
    pieces.append(_from_utf16(units[2 * pos :]))
    out = pieces[0]
    for piece in pieces[1:]:
        if piece.lstrip(" ")[:1] in {",", ".", ":", ";", "!", "?"}:  # "ask @bot, please" -> "ask, please"
            out, piece = out.rstrip(" "), piece.lstrip(" ")
        elif out and not out.endswith(("\n", " ")) and piece and not piece.startswith(("\n", " ")):
            out += " "
        elif out.endswith(" ") and piece.startswith(" "):
            piece = piece.lstrip(" ")
        out += piece
    out = out.strip()
    # "@bot, hi" / "@bot: hi" leave a stray separator in front.
    if out[:1] in {",", ":"} and spans and min(spans)[0] == 0:
        out = out[1:].lstrip()
    return out


def _entities(message: Message) -> tuple[str, tuple[MessageEntity, ...]]:
    if message.text is not None:
        return message.text, tuple(message.entities or ())
    return message.caption or "", tuple(message.caption_entities or ())


def _entity_text(text: str, entity: MessageEntity) -> str:
    units = _utf16(text)
    return _from_utf16(units[2 * entity.offset : 2 * (entity.offset + entity.length)])


# Entity offsets count UTF-16 units.  Lone surrogates (the Bot API can send them) pass through
# unchanged here and are replaced when the InboundMessage is made (gateway.types.clean_text).
def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le", "surrogatepass")


def _from_utf16(units: bytes) -> str:
    return units.decode("utf-16-le", "surrogatepass")


def _user_name(user: User) -> str:
    return user.full_name or user.username or str(user.id)


def normalize(message: Message, who: Addressing) -> InboundMessage | None:
    """The InboundMessage for ``message``, or None when the bot should not see it.

    ``attachments`` are left empty (downloading is the adapter's job).
    """
    chat = message.chat
    sender = message.from_user
    if sender is not None and (sender.id == who.bot_id or sender.is_bot):
        log.debug("ignoring a message from a bot (own=%s) in chat %s", sender.id == who.bot_id, chat.id)
        return None

    if chat.type == "private":
        chat_type, thread_id = ChatType.DM, None
    elif chat.type in ("group", "supergroup"):
        if message.is_topic_message and message.message_thread_id:
            chat_type, thread_id = ChatType.THREAD, str(message.message_thread_id)
        else:
            chat_type, thread_id = ChatType.GROUP, None
    elif chat.type == "channel":
        chat_type, thread_id = ChatType.CHANNEL, None
    else:
        log.debug("ignoring a message in an unknown chat type %r", chat.type)
        return None
    if sender is None and chat_type is not ChatType.CHANNEL:
        log.debug("ignoring a message without a sender in chat %s", chat.id)
        return None

    text, entities = _entities(message)
    me = who.bot_username.lower()
    remove: list[tuple[int, int]] = []
    mentioned = command = False
    command_text = command_name = ""
    for entity in entities:
        if entity.type == MessageEntity.MENTION and _entity_text(text, entity).lower() == f"@{me}":
            mentioned = True
            remove.append((entity.offset, entity.length))
        elif entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == who.bot_id:
            mentioned = True
        elif entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            command_text = _entity_text(text, entity)
            command_name, _, target = command_text.partition("@")
            if target and target.lower() != me:
                log.debug("ignoring command %s meant for @%s", command_name, target)
                return None
            command = True
    if remove:
        text = _utf16_slice_remove(text, remove)
    if command and text.startswith(command_text):  # "/help@our_bot args" -> "/help args"
        text = command_name + text[len(command_text) :]

    reply = message.reply_to_message
    replied_to_bot = bool(
        reply is not None
        and reply.from_user is not None
        and reply.from_user.id == who.bot_id
        and reply.forum_topic_created is None  # in a topic, every message "replies" to its creation
    )
    addressed = (
        chat_type is ChatType.DM
        or mentioned
        or command
        or replied_to_bot
        or not who.require_mention
        or str(chat.id) in who.free_response_channels
    )
    if not addressed:
        log.debug("dropping an un-addressed %s message in chat %s", chat_type.value, chat.id)
        return None

    return InboundMessage(
        platform=PLATFORM,
        chat_type=chat_type,
        chat_id=str(chat.id),
        thread_id=thread_id,
        user_id=str(sender.id) if sender is not None else None,
        user_name=_user_name(sender) if sender is not None else message.author_signature,
        text=clean_text(text).strip(),  # cleaned before the strip: a NUL must not shield a space
        message_id=str(message.message_id),
        addressed=True,
    )


def from_button(query: CallbackQuery) -> InboundMessage | None:
    """A press of one of our inline buttons as the presser's own message: the button's command
    (``/approve 3f9a1c07``), from the presser, in the chat (and topic) of the message it is under.
    None when the press carries no command or its message is out of reach (too old to be given)."""
    message = query.message
    data = query.data or ""
    if not data.startswith("/") or message is None or not isinstance(message, Message):
        return None
    chat = message.chat
    if chat.type == "private":
        chat_type, thread_id = ChatType.DM, None
    elif chat.type in ("group", "supergroup"):
        topic = message.is_topic_message and message.message_thread_id
        chat_type, thread_id = (ChatType.THREAD, str(message.message_thread_id)) if topic else (ChatType.GROUP, None)
    else:
        return None
    return InboundMessage(platform="telegram", chat_type=chat_type, chat_id=str(chat.id), user_id=str(query.from_user.id),
                          text=data, message_id=f"button:{query.id}", thread_id=thread_id,
                          user_name=_user_name(query.from_user), addressed=True)

