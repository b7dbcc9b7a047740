"""A Responses API request (``POST /v1/responses``) as the Chat Completions body it means, so it goes
through the same :func:`~gateway.runtime.api_request.parse_chat_request` and the same turn.

    chat_body, options = chat_body_of(body)

``instructions`` becomes a system message; ``input`` (a string, or items) becomes messages:
``message`` items (``input_text``, ``output_text`` and ``input_image`` parts), ``function_call``
items (joined into the assistant message they follow), ``function_call_output`` items (``tool``
messages); ``reasoning`` items are left out.  Function ``tools``, ``tool_choice``,
``max_output_tokens``, ``temperature``, ``top_p`` and ``text.format`` become their Chat Completions
forms.  What says where the conversation is kept (``previous_response_id``, ``conversation``) is in
:class:`ResponsesOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.runtime.api_request import ApiError

PASSED_AS_IS = ("model", "stream", "temperature", "top_p", "user", "safety_identifier", "prompt_cache_key")


@dataclass(frozen=True, slots=True)
class ResponsesOptions:
    """What a Responses request says beyond its messages."""

    previous_response_id: str | None = None
    conversation: str | None = None
    instructions: str | None = None
    metadata: dict | None = None


def chat_body_of(body: Any) -> tuple[dict, ResponsesOptions]:
    if not isinstance(body, dict):
        raise ApiError(400, "expected a JSON object with an 'input'", param="input")
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string", param="instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            _add_item(messages, item, f"input[{i}]")
    else:
        raise ApiError(400, "'input' must be a string or a list of items", param="input")
    chat: dict[str, Any] = {k: body[k] for k in PASSED_AS_IS if body.get(k) is not None}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _format((body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None)
    if response_format is not None:
        chat["response_format"] = response_format
    metadata = body.get("metadata")
    return chat, ResponsesOptions(
        previous_response_id=_text(body, "previous_response_id"),
        conversation=_conversation(body.get("conversation")),
        instructions=instructions or None,
        metadata=metadata if isinstance(metadata, dict) else None,
    )


def _add_item(messages: list[dict], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, f"{where} must be an object (a message, a function_call or a function_call_output)",
                       param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ApiError(400, f"{where}.role must be user, assistant, system or developer", param=f"{where}.role")
        messages.append({"role": role, "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        call_id, name = item.get("call_id"), item.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
            raise ApiError(400, f"{where} must have a 'call_id' and a 'name'", param=where)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": item.get("arguments") or ""}}
        if messages and messages[-1]["role"] == "assistant":  # the text the model wrote before it called
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError(400, f"{where} must have the 'call_id' of the call it answers", param=f"{where}.call_id")
        text = output if isinstance(output, str) else _content(output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    elif kind == "reasoning":
        return  # the model's own notes of an earlier answer: not read
    else:
        raise ApiError(400, f"{where} is a {kind!r} item; the gateway reads message, function_call, "
                            "function_call_output and reasoning items", param=f"{where}.type")


def _content(content: Any, where: str) -> Any:
    """Responses content parts as Chat Completions parts."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of parts", param=f"{where}.content")
    parts: list[dict] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal") or "")})
        else:
            raise ApiError(400, f"{where}.content[{j}] is not a part the gateway reads (input_text, output_text, "
                                "input_image)", param=f"{where}.content[{j}]")
    return parts


def _tools(tools: Any) -> list:
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of function tools", param="tools")
    found = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError(400, f"tools[{i}] is a {kind!r} tool; the gateway offers the model function tools only",
                           param=f"tools[{i}].type")
        found.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters",
                                                                             "strict") if tool.get(k) is not None}})
    return found


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice  # none, auto, required (anything else is refused as Chat Completions refuses it)


def _format(value: Any) -> dict | None:
    if value is None or (isinstance(value, dict) and value.get("type") == "text"):
        return None
    if isinstance(value, dict) and value.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: value[k] for k in ("name", "schema", "strict", "description")
                                                       if k in value}}
    if isinstance(value, dict) and value.get("type") == "json_object":
        return {"type": "json_object"}
    raise ApiError(400, "'text.format' must be of type text, json_object or json_schema", param="text.format")


def _text(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise ApiError(400, f"'{name}' must be a string of at most 256 characters", param=name)
    return value


def _conversation(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("id")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise ApiError(400, "'conversation' must be an id (a string of at most 256 characters) or {\"id\": ...}",
                       param="conversation")
    return value
