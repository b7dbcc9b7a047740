"""The A2A 1.0 wire shapes (the JSON form of the protocol's messages: camelCase fields, enum names), read
and written as plain dicts, and the JSON-RPC errors the protocol names.

What is read: a ``SendMessageRequest``'s message (its text parts; data parts as JSON text; files are
refused), its configuration (``returnImmediately``, ``taskPushNotificationConfig``, ``historyLength``),
and the ids of ``GetTask`` and ``CancelTask``.  What is written: a ``Task`` from a stored row of
:mod:`state._a2a`, and the stream's events (``task``, ``statusUpdate``, ``artifactUpdate``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gateway.errors import SwitchboardError

MAX_TEXT = 200_000  # characters of one message's text parts together
STATES = {"working": "TASK_STATE_WORKING", "completed": "TASK_STATE_COMPLETED", "failed": "TASK_STATE_FAILED",
          "canceled": "TASK_STATE_CANCELED"}
ARTIFACT_ID = "answer"


class RpcError(SwitchboardError):
    """A JSON-RPC error answered to the caller (the code is the protocol's: -32001 task not found ...)."""

    def __init__(self, code: int, message: str, *, status: int = 200):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status  # the HTTP status (401 for a missing or wrong token; 200 for the rest)


def invalid_params(message: str) -> RpcError:
    return RpcError(-32602, message)


def task_not_found(task_id: str) -> RpcError:
    return RpcError(-32001, f"no task {task_id!r} is known to this caller")


@dataclass(frozen=True, slots=True)
class SendRequest:
    """What a ``SendMessage`` asks: the text, the caller's ids, and how to answer."""

    message_id: str
    text: str
    context_id: str | None
    task_id: str | None
    return_immediately: bool
    push_url: str | None
    push_token: str | None
    history_length: int | None


def _text(value: Any, name: str, limit: int = 256) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid_params(f"{name} must be a string")
    if len(value) > limit:
        raise invalid_params(f"{name} must be at most {limit} characters")
    return value


def parse_send(params: Any) -> SendRequest:
    """A ``SendMessageRequest``'s params, or an :class:`RpcError` saying what is wrong with them."""
    if not isinstance(params, dict) or not isinstance(params.get("message"), dict):
        raise invalid_params("params.message is required: {\"message\": {\"messageId\": ..., \"role\": \"ROLE_USER\", "
                             "\"parts\": [{\"text\": ...}]}}")
    message = params["message"]
    message_id = _text(message.get("messageId"), "message.messageId")
    if message_id is None:
        raise invalid_params("message.messageId is required (a new id for each message; a retry sends the same)")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise invalid_params("message.parts must be a non-empty list of parts")
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise invalid_params(f"message.parts[{i}] must be an object")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            texts.append(json.dumps(part["data"], ensure_ascii=False))
        else:
            raise RpcError(-32005, f"message.parts[{i}]: only text and data parts are taken here (no files); "
                                   "send the file's content as text")
    text = "\n".join(texts)
    if not text.strip():
        raise invalid_params("the message's text is empty")
    if len(text) > MAX_TEXT:
        raise invalid_params(f"the message's text is {len(text)} characters, at most {MAX_TEXT}")
    config = params.get("configuration") or {}
    if not isinstance(config, dict):
        raise invalid_params("params.configuration must be an object")
    push = config.get("taskPushNotificationConfig") or {}
    if not isinstance(push, dict):
        raise invalid_params("configuration.taskPushNotificationConfig must be an object")
    history = config.get("historyLength")
    if history is not None and (not isinstance(history, int) or history < 0):
        raise invalid_params("configuration.historyLength must be a whole number, 0 or more")
    return SendRequest(message_id, text, _text(message.get("contextId"), "message.contextId", 128),
                       _text(message.get("taskId"), "message.taskId"), bool(config.get("returnImmediately")),
                       _text(push.get("url"), "taskPushNotificationConfig.url", 2048),
                       _text(push.get("token"), "taskPushNotificationConfig.token", 512), history)


def parse_id(params: Any) -> tuple[str, int | None]:
    """The task id (and ``historyLength``) of ``GetTask`` / ``CancelTask``."""
    if not isinstance(params, dict):
        raise invalid_params("params must be an object with the task's id: {\"id\": ...}")
    task_id = _text(params.get("id"), "id")
    if task_id is None:
        raise invalid_params("params.id (the task's id) is required")
    history = params.get("historyLength")
    if history is not None and (not isinstance(history, int) or history < 0):
        raise invalid_params("historyLength must be a whole number, 0 or more")
    return task_id, history


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def message(role: str, text: str, *, message_id: str, context_id: str, task_id: str) -> dict:
    return {"messageId": message_id, "contextId": context_id, "taskId": task_id,
            "role": "ROLE_USER" if role == "user" else "ROLE_AGENT", "parts": [{"text": text}]}


def status(row: dict, note: str | None = None) -> dict:
    """A task's ``TaskStatus``: its state, and the agent's last word (the answer, why it failed, a note)."""
    out: dict[str, Any] = {"state": STATES[row["state"]], "timestamp": _stamp(row["updated_at"] or time.time())}
    said = row["error"] if row["state"] == "failed" else note if row["state"] == "working" else None
    if said:
        out["message"] = message("agent", said, message_id=f"{row['id']}:status", context_id=row["context_id"],
                                 task_id=row["id"])
    return out


def artifact(text: str) -> dict:
    return {"artifactId": ARTIFACT_ID, "name": "answer", "parts": [{"text": text}]}


def task(row: dict, history: list[dict] | None = None, note: str | None = None) -> dict:
    """A stored task (a row of ``state._a2a``) as an A2A ``Task``; ``history``: its context's earlier rows."""
    out: dict[str, Any] = {"id": row["id"], "contextId": row["context_id"], "status": status(row, note)}
    if row["state"] == "completed" and row["answer"] is not None:
        out["artifacts"] = [artifact(row["answer"])]
    if history is not None:
        turns = []
        for earlier in history:
            turns.append(message("user", earlier["request"], message_id=f"{earlier['id']}:in",
                                 context_id=earlier["context_id"], task_id=earlier["id"]))
            if earlier["state"] == "completed" and earlier["answer"] is not None:
                turns.append(message("agent", earlier["answer"], message_id=f"{earlier['id']}:out",
                                     context_id=earlier["context_id"], task_id=earlier["id"]))
        out["history"] = turns
    return out


def status_update(row: dict, note: str | None = None) -> dict:
    return {"statusUpdate": {"taskId": row["id"], "contextId": row["context_id"], "status": status(row, note)}}


def artifact_update(row: dict, text: str, *, append: bool, last: bool) -> dict:
    return {"artifactUpdate": {"taskId": row["id"], "contextId": row["context_id"], "artifact": artifact(text),
                               "append": append, "lastChunk": last}}


def result(request_id: Any, value: Any) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: Any, exc: RpcError) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": exc.code, "message": exc.message}}
