"""Discord attachments to :class:`~gateway.types.Attachment`.

Every kind is downloaded within its limit (:class:`~gateway.types.MediaLimits`,
``media.max_bytes``): pictures, voice messages and audio files (kind
``audio``), documents.  Larger ones, failed downloads, videos and any
attachment whose URL is not on Discord's own file hosts (or the configured
API's host) are passed as a description (name, type, size) without
downloading: nothing is fetched from a URL Discord did not serve.  A broken
attachment is logged and skipped; it never stops the message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable
from urllib.parse import urlsplit

import aiohttp
import discord

from gateway.types import Attachment, MediaLimits, attachment_kind

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=30)
#: where Discord serves attachments from
FILE_HOSTS = frozenset({"cdn.discordapp.com", "media.discordapp.net"})


def _kind(att: discord.Attachment, mime: str | None) -> str:
    if getattr(att, "is_voice_message", lambda: False)():
        return "audio"
    return attachment_kind(mime, att.filename)


def served_by_discord(url: str, api_base_url: str | None) -> bool:
    """Whether ``url`` is on Discord's file hosts (https) or the configured API's own host."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname in FILE_HOSTS:
        return True
    if api_base_url:
        api = urlsplit(api_base_url)
        return (parts.scheme, parts.hostname, parts.port) == (api.scheme, api.hostname, api.port)
    return False


async def _download(session: aiohttp.ClientSession, url: str, max_bytes: int) -> bytes | None:
    """The body of ``url``, or None when it is not 200 or larger than ``max_bytes``."""
    async with session.get(url, timeout=DOWNLOAD_TIMEOUT, allow_redirects=False) as resp:
        if resp.status != 200:
            log.warning("discord attachment download answered %s; passing it without its bytes", resp.status)
            return None
        data = await resp.content.read(max_bytes + 1)
        if len(data) > max_bytes:
            log.warning("discord attachment is larger than %d bytes; passing it without its bytes", max_bytes)
            return None
        return data


async def collect(
    attachments: Iterable[discord.Attachment],
    session: aiohttp.ClientSession | None,
    *,
    limits: MediaLimits,
    api_base_url: str | None = None,
) -> tuple[Attachment, ...]:
    out: list[Attachment] = []
    for att in attachments:
        try:
            mime = att.content_type.split(";")[0].strip() if att.content_type else None
            kind = _kind(att, mime)
            limit = limits.for_kind(kind)
            data = None
            if session is not None and limit:
                if att.size > limit:
                    log.info("discord %s %s is %d bytes (limit %d); not downloaded", kind, att.id, att.size, limit)
                elif not served_by_discord(att.url, api_base_url):
                    log.warning("discord attachment %s is not on Discord's file hosts; not downloaded", att.id)
                else:
                    data = await _download(session, att.url, limit)
            out.append(Attachment(kind=kind, name=att.filename, mime_type=mime,
                                  size=len(data) if data is not None else att.size, url=att.url, data=data,
                                  duration=att.duration if kind == "audio" else None))  # a voice message's length
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad attachment must not lose the message
            log.warning("discord attachment %s skipped: %s", getattr(att, "id", "?"), type(exc).__name__)
    return tuple(out)
