"""Attachments: images downloaded (bounded) for a vision model, voice and audio for transcription,
other files described.

An image is downloaded only when vision is on and it fits ``max_image_bytes``
(for photos, the largest size Telegram offers that fits).  Anything else, and
any image that is too big or fails to download, becomes an
``Attachment(kind="file")`` with name, type and size, so the message still
goes through and the model knows something was attached.
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from typing import Sequence

from telegram import Bot, Message, PhotoSize
from telegram.warnings import PTBDeprecationWarning

from gateway.types import Attachment

from .redact import describe

log = logging.getLogger(__name__)

_OTHER_MEDIA = ("video", "video_note", "animation", "sticker")
# A voice note or an audio file is downloaded (up to this size; the Bot API serves at most 20 MB) for the
# gateway to transcribe; larger, or failing to download, it is described like any other file.
MAX_AUDIO_BYTES = 20 * 1024 * 1024


async def collect_attachments(bot: Bot, message: Message, *, vision: bool, max_image_bytes: int) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    if message.photo:
        found.append(await _photo(bot, message.photo, vision=vision, limit=max_image_bytes))
    doc = message.document
    if doc is not None:
        mime = doc.mime_type or None
        if mime and mime.startswith("image/"):
            found.append(await _image(bot, doc.file_id, doc.file_name or "image", mime, doc.file_size,
                                      vision=vision, limit=max_image_bytes))
        else:
            found.append(Attachment(kind="file", name=doc.file_name or "file", mime_type=mime, size=doc.file_size))
    for kind in ("voice", "audio"):
        media = getattr(message, kind, None)
        if media is not None:
            found.append(await _audio(bot, media, kind))
    for kind in _OTHER_MEDIA:
        media = getattr(message, kind, None)
        if media is None or (kind == "animation" and doc is not None):  # a GIF comes as both
            continue
        found.append(Attachment(kind="file", name=getattr(media, "file_name", None) or kind,
                                mime_type=getattr(media, "mime_type", None), size=getattr(media, "file_size", None)))
    return tuple(found)


async def _photo(bot: Bot, sizes: Sequence[PhotoSize], *, vision: bool, limit: int) -> Attachment:
    fitting = [p for p in sizes if p.file_size is None or p.file_size <= limit]  # smallest first
    best = fitting[-1] if fitting else sizes[-1]
    return await _image(bot, best.file_id, "photo.jpg", "image/jpeg", best.file_size, vision=vision, limit=limit)


async def _image(bot: Bot, file_id: str, name: str, mime: str, size: int | None, *, vision: bool,
                 limit: int) -> Attachment:
    if not vision:
        return Attachment(kind="image", name=name, mime_type=mime, size=size)
    if size is not None and size > limit:
        log.info("not downloading a %d-byte image (limit %d bytes)", size, limit)
        return Attachment(kind="file", name=name, mime_type=mime, size=size)
    try:
        file = await bot.get_file(file_id)
        if file.file_size is not None and file.file_size > limit:
            raise ValueError(f"{file.file_size} bytes is over the {limit}-byte limit")
        data = bytes(await file.download_as_bytearray())
        if len(data) > limit:
            raise ValueError(f"{len(data)} bytes is over the {limit}-byte limit")
    except Exception as exc:  # noqa: BLE001 - the message still goes through without the image
        log.warning("could not download a telegram image: %s", describe(exc))
        return Attachment(kind="file", name=name, mime_type=mime, size=size)
    return Attachment(kind="image", name=name, mime_type=mime, size=len(data), data=data)


async def _audio(bot: Bot, media, kind: str) -> Attachment:
    """A voice note or audio file, downloaded within MAX_AUDIO_BYTES, with Telegram's ``duration``."""
    name = getattr(media, "file_name", None) or ("voice.ogg" if kind == "voice" else "audio")
    mime, size = media.mime_type or ("audio/ogg" if kind == "voice" else None), media.file_size
    duration = _seconds(media)
    if size is not None and size > MAX_AUDIO_BYTES:
        log.info("not downloading a %d-byte %s (limit %d bytes)", size, kind, MAX_AUDIO_BYTES)
        return Attachment(kind="file", name=name, mime_type=mime, size=size, duration=duration)
    try:
        file = await bot.get_file(media.file_id)
        data = bytes(await file.download_as_bytearray())
        if len(data) > MAX_AUDIO_BYTES:
            raise ValueError(f"{len(data)} bytes is over the {MAX_AUDIO_BYTES}-byte limit")
    except Exception as exc:  # noqa: BLE001 - the message still goes through, the audio described
        log.warning("could not download a telegram %s: %s", kind, describe(exc))
        return Attachment(kind="file", name=name, mime_type=mime, size=size, duration=duration)
    return Attachment(kind="audio", name=name, mime_type=mime, size=len(data), data=data, duration=duration)


def _seconds(media) -> float | None:
    """The clip's ``duration`` in seconds (an int today, a timedelta in a later python-telegram-bot); 0: unknown."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)  # the int form is what we read, either way
        value = media.duration
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    return float(value) if value else None
