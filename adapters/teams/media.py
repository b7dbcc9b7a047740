"""Files people send in Teams, downloaded within their kind's limit (:class:`~gateway.types.MediaLimits`).

A file shared in a chat arrives as a ``file.download.info`` attachment whose ``downloadUrl`` is a
short-lived pre-authenticated link on SharePoint (no token sent); a pasted picture as an ``image/*`` attachment
whose ``contentUrl`` is on the connector, which wants the bot's token, sent only when the URL's host
is the activity's ``serviceUrl`` host.  Nothing is fetched from anywhere else: only https URLs on
``*.sharepoint.com`` (and its China and test clouds) or the serviceUrl's host (http on loopback, for tests);
anything too big, refused or unreachable is passed with its name alone, so the message still goes
through and the model knows something was attached.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp

from gateway.types import Attachment, MediaLimits, attachment_kind

from .outbound import allowed_service_url

log = logging.getLogger(__name__)

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=60)
# where Teams keeps what people share (SharePoint and OneDrive), besides the activity's own connector
FILE_HOSTS = (".sharepoint.com", ".sharepoint.cn", ".sharepoint-df.com")
_TYPES = {"pdf": "application/pdf", "txt": "text/plain", "md": "text/markdown", "csv": "text/csv",
          "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
          "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}


async def collect(http: aiohttp.ClientSession, files: list[dict], *, service_url: str, token,
                  limits: MediaLimits) -> tuple[Attachment, ...]:
    found = []
    for item in files:
        mime = item.get("mime") or _TYPES.get((item.get("file_type") or "").lower())
        kind = attachment_kind(mime, item["name"])
        found.append(await _download(http, item["url"], item["name"], mime, kind, limits.for_kind(kind),
                                     service_url=service_url, token=token))
    return tuple(found)


async def _download(http: aiohttp.ClientSession, url: str, name: str, mime: str | None, kind: str, limit: int,
                    *, service_url: str, token) -> Attachment:
    described = Attachment(kind=kind, name=name, mime_type=mime)
    host = (urlsplit(url).hostname or "").lower()
    served = host == (urlsplit(service_url).hostname or "").lower() or host.endswith(FILE_HOSTS)
    if limit <= 0 or not served or not allowed_service_url(url, ()):
        return described
    headers = {}
    if urlsplit(url).hostname == urlsplit(service_url).hostname:
        try:
            headers["Authorization"] = f"Bearer {await token.get()}"
        except Exception as exc:  # noqa: BLE001 - described instead
            log.info("teams: no token to fetch %s: %s", name, type(exc).__name__)
            return described
    try:
        async with http.get(url, headers=headers, timeout=HTTP_TIMEOUT, allow_redirects=False) as resp:
            if resp.status != 200:
                log.info("teams: downloading %s answered %d; passing it on by name", name, resp.status)
                return described
            if resp.content_length is not None and resp.content_length > limit:
                return Attachment(kind=kind, name=name, mime_type=mime, size=resp.content_length)
            data = bytearray()
            async for chunk in resp.content.iter_chunked(65536):
                data.extend(chunk)
                if len(data) > limit:
                    return Attachment(kind=kind, name=name, mime_type=mime, size=len(data))
            mime = mime or resp.content_type or None
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        log.info("teams: downloading %s failed (%s); passing it on by name", name, type(exc).__name__)
        return described
    return Attachment(kind=kind, name=name, mime_type=mime, size=len(data), data=bytes(data))
