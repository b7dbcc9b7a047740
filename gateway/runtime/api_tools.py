"""A local API client's own tools: offered to the model beside the agent's, run by the client.

A turn whose model calls one of the client's tools ends there: the stored session gets the
assistant's tool-call message (and the results of any agent tool called with it), and the answer is
the calls, ``finish_reason: "tool_calls"``.  The client runs them and sends the results back as
``tool`` messages (after the assistant message that called them, as the OpenAI API has it): that
request *continues* the turn.  :func:`store_results` stores what it brings that the session lacks
(the call message, if the session does not hold it, and each result once), no user message is
stored or asked again, and the model answers on from there.

The agent's own tools still run inside the gateway; a client tool named like one of them is refused
(:func:`check_names`), since the model could not tell which one it calls.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from gateway.runtime.api_request import ApiError, ChatRequest
from state import AsyncSessionDB


def check_names(request: ChatRequest, agent_tools: list[str]) -> None:
    """A 400 naming the first client tool whose name one of the agent's own tools has."""
    taken = set(agent_tools)
    for i, tool in enumerate(request.tools):
        name = tool["function"]["name"]
        if name in taken:
            raise ApiError(400, f"the tool name {name!r} is taken by one of the gateway's own tools (its tools: "
                                f"{', '.join(sorted(taken))}); rename your tool", param=f"tools[{i}].function.name",
                           code="tool_name_conflict")


async def store_results(db: AsyncSessionDB, session_id: str, continued: tuple[dict, ...]) -> None:
    """Store the tool-call messages and results of a continuation that ``session_id`` does not hold yet.

    A result must answer a call the session holds (or the request carries); a continuation whose
    results are all stored and already answered is refused (409), so a resent request never makes
    the model answer twice."""
    rows = await db.messages.get(session_id)
    calls = {call["id"]: at for at, row in enumerate(rows) if row.role == "assistant" for call in row.tool_calls or []}
    results = {row.tool_call_id: at for at, row in enumerate(rows) if row.role == "tool"}
    names = {call["id"]: call["function"]["name"]
             for calls_made in [*(row.tool_calls for row in rows if row.role == "assistant"),
                                *(m.get("tool_calls") for m in continued if m["role"] == "assistant")]
             for call in calls_made or []}
    new: list[dict] = []
    for message in continued:
        if message["role"] == "assistant":
            ids = [call["id"] for call in message["tool_calls"]]
            if not any(i in calls for i in ids):  # calls the session does not hold (a history from elsewhere)
                new.append({**message, "finish_reason": "tool_calls"})
                calls.update((i, len(rows)) for i in ids)
            continue
        call_id = message["tool_call_id"]
        if call_id in results:
            continue
        if call_id not in calls:
            raise ApiError(400, f"no tool call with the id {call_id!r} waits for a result in this conversation; "
                                "send the assistant message that made it before its result", param="messages",
                           code="unknown_tool_call")
        new.append({"role": "tool", "tool_call_id": call_id, "content": message["content"],
                    "tool_name": names.get(call_id)})
        results[call_id] = len(rows)
    if new:
        await db.messages.append_many(session_id, new)
        return
    last = max(results[m["tool_call_id"]] for m in continued if m["role"] == "tool")
    if any(row.role == "assistant" for row in rows[last + 1:]):
        raise ApiError(409, "these tool results were answered already; send the next message (or your history "
                            "from before that answer, to have it answered again in a branch)", "conflict",
                       code="conflict")


def with_results(db: AsyncSessionDB, request: ChatRequest,
                 prepare: Callable[[], Awaitable[str | None]]) -> Callable[[], Awaitable[str | None]]:
    """``prepare`` (which stores the client's messages and returns the session), then the tool results
    the request continues with."""
    if not request.continued:
        return prepare

    async def prepared() -> str | None:
        session_id = await prepare()
        if session_id is not None:
            await store_results(db, session_id, request.continued)
        return session_id

    return prepared


def continue_routed(db: AsyncSessionDB, key: str, request: ChatRequest) -> Callable[[], Awaitable[str | None]]:
    """The ``prepare`` of a continuation in a conversation the gateway keeps (``X-Session-Key``): its
    results go to the session ``key`` routes to."""

    async def prepared() -> str | None:
        session = await db.routes.session(key)
        if session is None:
            raise ApiError(400, "no conversation under this session waits for tool results; send the tool "
                                "results in the session whose answer called the tools", param="messages",
                           code="unknown_tool_call")
        await store_results(db, session["id"], request.continued)
        return session["id"]

    return prepared

