"""A tool call in rounds: on revision 2026-07-28 a server that needs the user's input mid-call answers
``InputRequiredResult`` (its questions, keyed, and an opaque ``request_state``), and the client sends
the original call again carrying the answers and that state.  We drive those rounds ourselves (the
SDK's documented way to keep ``request_state``) so that each question knows its round: stored with
it (:class:`Round`), a question outlives a restart, and the call is sent again with its answer by the
turn resumed after it (gateway.tools_mcp.questions).

    result = await call_in_rounds(client, "book", {}, timeout=30, dispatch=ask, resend=claim)

``dispatch(round, key, request)`` answers one input request (the client's callbacks: elicitation
reaches our questions); ``resend(round)`` is awaited before a round's answers are sent, so a crash
after it never sends them again.  A legacy server never answers ``InputRequiredResult`` (it asks by
its own requests to the client, answered by the same callbacks): its call is one round.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from gateway.errors import SwitchboardError

if TYPE_CHECKING:  # pragma: no cover
    from mcp import Client, types

log = logging.getLogger(__name__)

MAX_ROUNDS = 10  # a server that keeps asking past this is refused (the SDK's own default)


@dataclass(frozen=True, slots=True)
class Round:
    """One ``InputRequiredResult`` of a call: what sending the call again with its answers needs."""

    round_id: str
    tool: str  # the server's own name of the tool
    arguments: dict[str, Any]
    request_state: str | None
    keys: tuple[str, ...]  # the input requests the server made in this round

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Round:
        return cls(data["round_id"], data["tool"], dict(data["arguments"]), data["request_state"],
                   tuple(data["keys"]))


# The answers a resumed call is sent with: its round, and the responses by key.
Seed = tuple[Round, "types.InputResponses"]
Dispatch = Callable[[Round, str, "types.InputRequest"], Awaitable["types.InputResponse | types.ErrorData"]]
Resend = Callable[[Round], Awaitable[None]]


class TooManyRounds(SwitchboardError):
    """A server kept asking for input past MAX_ROUNDS in one call: the call ends with this as its error."""

    def __init__(self) -> None:
        super().__init__(f"the server asked for input more than {MAX_ROUNDS} times in one call")


async def call_in_rounds(client: Client, tool: str, arguments: dict[str, Any], *, timeout: float,
                         dispatch: Dispatch, resend: Resend, seed: Seed | None = None) -> types.CallToolResult:
    """``tools/call`` until the server gives its result (MCPError and TooManyRounds are raised)."""
    from mcp import MCPError, types

    current = None
    if seed is not None:
        round_, responses = seed
        try:
            current = await _send(client, tool, arguments, timeout, responses, round_.request_state)
        except MCPError as exc:
            if not _stale(exc):
                raise
            # the server no longer takes that round (it restarted with a new key, or the state ran out):
            # the call is sent afresh, so it asks again
            log.info("the server refused the round of %s from before the restart (%s); sent afresh", tool,
                     exc.error.message)
    if current is None:
        current = await _send(client, tool, arguments, timeout, None, None)
    for _ in range(MAX_ROUNDS):
        if not isinstance(current, types.InputRequiredResult):
            return current
        round_ = Round(secrets.token_hex(6), tool, dict(arguments), current.request_state,
                       tuple(current.input_requests or {}))
        responses = {}
        for key, request in (current.input_requests or {}).items():  # one at a time: each may ask the user
            got = await dispatch(round_, key, request)
            if isinstance(got, types.ErrorData):
                raise MCPError.from_error_data(got)
            responses[key] = got
        await resend(round_)
        current = await _send(client, tool, arguments, timeout, responses or None, current.request_state)
    raise TooManyRounds()


def _stale(exc: Any) -> bool:
    from mcp_types import INVALID_PARAMS

    data = exc.error.data
    return exc.error.code == INVALID_PARAMS and isinstance(data, dict) and data.get("reason") == "invalid_request_state"


async def _send(client: Client, tool: str, arguments: dict[str, Any], timeout: float,
                responses: types.InputResponses | None, request_state: str | None) -> Any:
    """One ``tools/call``; a 2026-07-28 server that says the listing it saw is stale (HEADER_MISMATCH: a
    connection that never listed, or a schema that changed) gets it read again and the call once more."""
    from mcp import MCPError
    from mcp_types import HEADER_MISMATCH

    async def once() -> Any:
        return await client.session.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                              input_responses=responses, request_state=request_state,
                                              allow_input_required=True)

    try:
        return await once()
    except MCPError as exc:
        if exc.error.code != HEADER_MISMATCH:
            raise
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        cursor = page.next_cursor
        if not cursor or any(t.name == tool for t in page.tools):
            break
    return await once()
