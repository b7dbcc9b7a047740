"""One adapter's own paths (``PlatformConfig.HTTP_PATHS``) served as the daemon serves them, without the daemon.

    async with serving("teams", lambda: adapter) as base:   # base: http://127.0.0.1:<port>
        teams.endpoint = base + "/teams/messages"

The real :class:`gateway.runtime.platform_http.PlatformHttp` mounts the platform's paths on an aiohttp
application on 127.0.0.1 (port 0) with the local API's body limit; ``adapter()`` is asked on every
request (None: the platform is not running, and the request gets 503), so a test can start and stop
adapters behind one address.  Adapter tests use it; the conformance kit runs the whole gateway.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from aiohttp import web

from gateway.config import platform_models
from gateway.runtime.api import MAX_BODY_BYTES
from gateway.runtime.platform_http import PlatformHttp


@asynccontextmanager
async def serving(platform: str, adapter: Callable[[], object | None]) -> AsyncIterator[str]:
    paths = PlatformHttp(tuple((platform, path) for path in platform_models()[platform].HTTP_PATHS),
                         lambda name: adapter() if name == platform else None)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    paths.mount(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
