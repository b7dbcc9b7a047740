"""The session router (see :mod:`gateway.router.router`): its parts, and the names others use."""

from gateway.control import NO_EXTRAS, STOPPED_MARK, RequestExtras

from .guard import SINGLE_INSTANCE, TurnClaim, TurnGuard
from .lanes import MAX_IDLE_LANES, Lane
from .outbox import Outbox
from .router import RouterControl, SessionRouter
from .shared import (
    STOPPED_BEFORE_ANSWERING,
    STORE_DAMAGED_LINE,
    RouterSettings,
    SessionHooks,
    StreamedOutput,
    Ticket,
    Typing,
)

__all__ = [
    "MAX_IDLE_LANES",
    "NO_EXTRAS",
    "SINGLE_INSTANCE",
    "STOPPED_BEFORE_ANSWERING",
    "STOPPED_MARK",
    "STORE_DAMAGED_LINE",
    "Lane",
    "Outbox",
    "RequestExtras",
    "RouterControl",
    "RouterSettings",
    "SessionHooks",
    "SessionRouter",
    "StreamedOutput",
    "Ticket",
    "TurnClaim",
    "TurnGuard",
    "Typing",
]
