"""Attachments: every kind downloaded within its limit, bigger ones described.

Photos, voice notes, audio files and documents are downloaded when they fit
their kind's limit (:class:`~gateway.types.MediaLimits`, ``media.max_bytes``;
for photos, the largest size Telegram offers that fits); the gateway keeps them
in its media store.  Anything else (videos, stickers), anything too big and
anything that fails to download is passed with name, type and size only, so
the message still goes through and the model knows something was attached.
Files are fetched only through the Bot API's getFile, from the file URL the
adapter was configured with: never from a URL a message carries.
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from typing import Sequence

from telegram import Bot, Message, PhotoSize
from telegram.warnings import PTBDeprecationWarning

from gateway.types import Attachment, MediaLimits, attachment_kind

from .redact import describe

log = logging.getLogger(__name__)

_AUDIO = ("voice", "audio")  # a voice note, an audio file: kind "audio"
_OTHER_MEDIA = ("video", "video_note", "animation", "sticker")  # described, never downloaded


async def collect_attachments(bot: Bot, message: Message, *, limits: MediaLimits) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if message.photo:
        found.append(await _photo(bot, message.photo, limit=limits.image))
    doc = message.document
    if doc is not None:
        name = doc.file_name or "file"
        kind = attachment_kind(doc.mime_type, name)
        found.append(await _download(bot, kind, doc.file_id, name, doc.mime_type or None, doc.file_size,
                                     limit=limits.for_kind(kind)))
    for kind in _AUDIO:
        media = getattr(message, kind, None)
        if media is not None:
            name = getattr(media, "file_name", None) or ("voice.ogg" if kind == "voice" else "audio")
            mime = getattr(media, "mime_type", None) or ("audio/ogg" if kind == "voice" else None)
            found.append(await _download(bot, "audio", media.file_id, name, mime, getattr(media, "file_size", None),
                                         limit=limits.audio, duration=_seconds(media)))
    for kind in _OTHER_MEDIA:
        media = getattr(message, kind, None)
        if media is None or (kind == "animation" and doc is not None):  # a GIF comes as both
            continue
        found.append(Attachment(kind="file", name=getattr(media, "file_name", None) or kind,
                                mime_type=getattr(media, "mime_type", None), size=getattr(media, "file_size", None)))
    return tuple(found)


async def _photo(bot: Bot, sizes: Sequence[PhotoSize], *, limit: int) -> Attachment:
    fitting = [p for p in sizes if p.file_size is None or p.file_size <= limit]  # smallest first
    best = fitting[-1] if fitting else sizes[-1]
    return await _download(bot, "image", best.file_id, "photo.jpg", "image/jpeg", best.file_size, limit=limit)


async def _download(bot: Bot, kind: str, file_id: str, name: str, mime: str | None, size: int | None, *,
                    limit: int, duration: float | None = None) -> Attachment:
    """The file within ``limit``, else described (name, type, size); a clip keeps Telegram's ``duration``."""
    described = Attachment(kind=kind, name=name, mime_type=mime, size=size, duration=duration)
    if size is not None and size > limit:
        log.info("not downloading a %d-byte %s (limit %d bytes)", size, kind, limit)
        return described
    try:
        file = await bot.get_file(file_id)
        if file.file_size is not None and file.file_size > limit:
            raise ValueError(f"{file.file_size} bytes is over the {limit}-byte limit")
        data = bytes(await file.download_as_bytearray())
        if len(data) > limit:
            raise ValueError(f"{len(data)} bytes is over the {limit}-byte limit")
    except Exception as exc:  # noqa: BLE001 - the message still goes through without the file
        log.warning("could not download a telegram %s: %s", kind, describe(exc))
        return described
    return Attachment(kind=kind, name=name, mime_type=mime, size=len(data), data=data, duration=duration)


def _seconds(media) -> float | None:
    """The clip's ``duration`` in seconds (an int today, a timedelta in a later python-telegram-bot); 0: unknown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)  # the int form is what we read, either way
        value = media.duration
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    return float(value) if value else None
