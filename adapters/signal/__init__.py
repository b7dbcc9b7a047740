"""Signal through a ``signal-cli`` daemon the operator runs (``signal-cli -a ACCOUNT daemon --http``).

No library: signal-cli's HTTP interface is JSON-RPC 2.0 (``POST /api/v1/rpc``) and a Server-Sent
Events stream of what it receives (``GET /api/v1/events``), both plain HTTP the aiohttp client the
gateway ships already speaks; the Python wrappers for it (``pysignalclirestapi`` and others) target
the separate signal-cli-rest-api container instead.

Modules: ``adapter`` (lifecycle, inbound delivery, sending), ``stream`` (the event stream, resumed
with ``Last-Event-ID`` after a cut or a signal-cli restart), ``rpc`` (the JSON-RPC client and its
errors), ``events`` (an envelope -> InboundMessage), ``config`` (the ``platforms.signal`` settings).
"""

from adapters import lazy_exports

from .config import SignalConfig

__all__ = ["SignalAdapter", "SignalConfig"]
__getattr__ = lazy_exports(__name__, {"SignalAdapter": ".adapter"})
