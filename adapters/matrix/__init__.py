"""Matrix on matrix-nio: /sync from a stored token, DMs, rooms and threads, edits, reactions, media, E2EE.

Why matrix-nio and not mautrix-python: both are maintained asyncio clients, but nio keeps the
protocol's state (rooms, members, encryption state) apart from its I/O and speaks the client-server
API as one plain ``AsyncClient`` with typed responses (``RoomSendError.retry_after_ms``), which is
what an adapter of a few modules needs: its own /sync loop (``sync``), its own retries and pacing
(``outbound``), the content repository (``media``).  mautrix is built for bridges and appservices
(its client, state store and crypto store come as one framework), more than a bot account needs.

End-to-end encrypted rooms (``crypto``): nio 0.26's ``e2e`` extra does Olm and Megolm on vodozemac
(the maintained implementation, through its Python bindings; libolm and python-olm were deprecated
in 2024).  The device's keys and sessions are in nio's SQLite store in the home, and keys, claims and
to-device messages are handled in our own /sync loop, so the sync's guarantees hold for encrypted
messages too.  In a cluster only the sync owner could hold that store, so E2EE with a cluster is
refused at the config check (``MatrixConfig.cluster_problem``; docs/platforms.md).

Modules: ``adapter`` (log-in, lifecycle, inbound delivery, sending), ``sync`` (the /sync loop and its
stored ``next_batch``), ``events`` (event JSON -> InboundMessage), ``format`` (Markdown ->
``body`` and ``formatted_body``), ``outbound`` (events sent within the room's budget, one transaction
id per event, encrypted in an encrypted room), ``crypto`` (the device's keys, decryption, room keys
shared by ``device_trust``), ``media`` (``mxc://`` downloads, encrypted files decrypted), ``config``
(the ``platforms.matrix`` settings).
"""

from adapters import lazy_exports

from .config import MatrixConfig

__all__ = ["MatrixAdapter", "MatrixConfig"]
__getattr__ = lazy_exports(__name__, {"MatrixAdapter": ".adapter"})
