"""Matrix on matrix-nio: /sync from a stored token, DMs, rooms and threads, edits, reactions, media.

Why matrix-nio and not mautrix-python: both are maintained asyncio clients, but nio keeps the
protocol's state (rooms, members, encryption state) apart from its I/O and speaks the client-server
API as one plain ``AsyncClient`` with typed responses (``RoomSendError.retry_after_ms``), which is
what an adapter of a few modules needs: its own /sync loop (``sync``), its own retries and pacing
(``outbound``), the content repository (``media``).  mautrix is built for bridges and appservices
(its client, state store and crypto store come as one framework), more than a bot account needs.

End-to-end encryption is not supported yet.  matrix-nio 0.26's ``e2e`` extra does its crypto on
vodozemac (the maintained Olm/Megolm, through the vodozemac Python bindings; libolm and python-olm
were deprecated in 2024), so this is work left, not a missing library: the device's keys and room
sessions in a crypto store in the home, keys uploaded and claimed, to-device events handled in our
own /sync loop, and, in a cluster, a crypto store every owner can reach.  Until then the adapter says
so in an encrypted room once and logs every encrypted event, never ignoring a message silently
(docs/platforms.md).

Modules: ``adapter`` (log-in, lifecycle, inbound delivery, sending), ``sync`` (the /sync loop and its
stored ``next_batch``), ``events`` (event JSON -> InboundMessage), ``format`` (Markdown ->
``body`` and ``formatted_body``), ``outbound`` (events sent within the room's budget, one transaction
id per event), ``media`` (``mxc://`` downloads), ``config`` (the ``platforms.matrix`` settings).
"""

from adapters import lazy_exports

from .config import MatrixConfig

__all__ = ["MatrixAdapter", "MatrixConfig"]
__getattr__ = lazy_exports(__name__, {"MatrixAdapter": ".adapter"})
