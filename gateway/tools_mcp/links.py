"""A server's link for the user to open mid-call (MCP URL-mode elicitation), sent to the asker alone.

    links = ToolLinks()
    await links.ask(asking, params, router)    # ToolQuestions.ask hands it a URL-mode request
    await links.done("calendar", "e1", router) # the server's notifications/elicitation/complete

Some things must not pass through the chat or the model: a password, a payment, signing in to a
third party.  A server then asks the user to open a link (with its message saying why).  The link
goes to the person whose call it is and to nobody else: in a direct chat there, from a group in a
direct message (the group is told to look there), with the server's message, the full address and
its host named apart (so a link that hides where it goes is seen).  The server is answered
``accept``: the user was given the link; what happens there is between them and the server, which
the gateway never opens or fetches.  A link that is not http(s) is refused (``decline``), and so is
one that cannot be sent.  When the server says the step is done (``notifications/elicitation/complete``)
the asker is told, where the link went.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.tools_mcp.server import SEPARATOR, Asking
from gateway.types import ChatRef

if TYPE_CHECKING:  # pragma: no cover
    from mcp import types

    from gateway.control import ChatControl

log = logging.getLogger(__name__)

MAX_URL = 2000  # longer than any link meant for a person
MAX_OPEN = 200  # links sent and not reported done, kept to tell their completion (the oldest forgotten first)


class ToolLinks:
    def __init__(self) -> None:
        self._open: dict[tuple[str, str], tuple[ChatRef, str]] = {}  # (server, elicitation id) -> where, tool

    async def ask(self, asking: Asking, params: types.ElicitRequestURLParams, router: ChatControl,
                  chat: ChatRef) -> types.ElicitResult:
        from mcp import types

        ctx = asking.context
        url = params.url.strip()
        host = urlsplit(url).hostname if len(url) <= MAX_URL else None
        if urlsplit(url).scheme not in ("https", "http") or not host:
            log.warning("%s asked the user to open a link that is not a web address; declined", asking.tool)
            await router.deliver(chat, f"{asking.tool} asked you to open a link that is not a web address; "
                                       "it was told no.", None)
            return types.ElicitResult(action="decline")
        text = (f"**{asking.tool}** asks you to open a link: {params.message.strip()[:1500]}\n{url}\n"
                f"(it goes to {host}; the link is for you alone, and {asking.tool} goes on once you are done there)")
        direct = ":dm:" in (ctx.session_key or "") or ctx.user_id is None
        where = chat if direct else ChatRef(chat.platform, str(ctx.user_id))
        sent = await _tell(router, where, text)
        if not direct:
            await _tell(router, chat, f"{asking.tool} needs you to open a link: " + (
                "I sent it to you in a direct message." if sent else
                "I could not message you directly, so it was told no; write to me there and ask again."))
        if not sent:
            return types.ElicitResult(action="decline")
        if len(self._open) >= MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        if params.elicitation_id:  # what its completion will name
            self._open[(asking.tool.partition(SEPARATOR)[0], params.elicitation_id)] = (where, asking.tool)
        log.info("%s sent the user a link to open (at %s)", asking.tool, host)
        return types.ElicitResult(action="accept")

    async def done(self, server: str, elicitation_id: str, router: ChatControl | None) -> None:
        """The server says the step at the link is done: the asker is told (once; an unknown id: nothing)."""
        known = self._open.pop((server, elicitation_id), None)
        if known is None or router is None:
            return
        where, tool = known
        await _tell(router, where, f"{tool}: the step at the link is done.")


async def _tell(router: ChatControl, chat: ChatRef, text: str) -> bool:
    try:
        await router.deliver(chat, text, None)
        return True
    except Exception as exc:  # noqa: BLE001 - a link that cannot be sent is declined
        log.warning("a link to open could not be sent to %s: %s", chat.platform, type(exc).__name__)
        return False
