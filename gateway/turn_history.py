"""The stored conversation as a model is sent it, and a turn's messages as the store keeps them.

Pure functions over message dicts (no I/O), used by :class:`gateway.turn.AgentTurn`: earlier turns'
reasoning left out or kept (``replayed_history``), a result for every tool call a client left without
one, consecutive user messages merged for models that demand alternation, pictures taken out for a model
that refused them.
"""

from __future__ import annotations


def for_store(message: dict) -> dict:
    if message["role"] == "tool":
        return {"role": "tool", "content": message["content"], "tool_call_id": message["tool_call_id"], "tool_name": message.get("name")}
    return {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"], "finish_reason": "tool_calls",
            **reasoning_of(message)}


# The fields in which models return their reasoning (OpenRouter's ``reasoning`` and ``reasoning_details``,
# DeepSeek's and Kimi's ``reasoning_content``, OpenAI's encrypted reasoning items as the Codex
# client keeps them).  A model that reasons before a tool call expects them back, unchanged, on
# the next request of the same tool loop.
REASONING_KEYS = ("reasoning", "reasoning_content", "reasoning_details", "codex_reasoning_items")


def reasoning_of(message: dict) -> dict:
    return {key: message[key] for key in REASONING_KEYS if message.get(key) is not None}


def without_reasoning(message: dict) -> dict:
    if message.keys().isdisjoint(REASONING_KEYS):  # most messages: no copy
        return message
    return {k: v for k, v in message.items() if k not in REASONING_KEYS}


NO_RESULT = "error: no result came back for this call (the client went on without it)"


def with_unanswered_calls(history: list[dict]) -> list[dict]:
    """``history`` with a result for every tool call that has none: a local API client may send a new
    message instead of its tools' results, and a model refuses a call left without a result."""
    answered = {m.get("tool_call_id") for m in history if m.get("role") == "tool"}
    if all(c.get("id") in answered for m in history for c in m.get("tool_calls") or []):
        return history
    out: list[dict] = []
    missing: list[str] = []
    for message in history:
        if missing and message.get("role") != "tool":  # the call's own results end here
            out += [{"role": "tool", "tool_call_id": call_id, "content": NO_RESULT} for call_id in missing]
            missing = []
        out.append(message)
        missing += [c.get("id") for c in message.get("tool_calls") or [] if c.get("id") not in answered]
    if missing and out and out[-1].get("role") != "assistant":  # unanswered calls still awaited go last
        out += [{"role": "tool", "tool_call_id": call_id, "content": NO_RESULT} for call_id in missing]
    return out


def merged_user_messages(history: list[dict]) -> list[dict]:
    """``history`` with each run of consecutive user messages joined into one (their texts a blank line
    apart), for models whose chat template demands that user and assistant alternate."""
    out: list[dict] = []
    for message in history:
        if message.get("role") == "user" and out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": _joined(out[-1].get("content"), message.get("content"))}
        else:
            out.append(message)
    return out


def _joined(first, second):
    """Two user messages' contents as one: text a blank line apart, or (images among them) all their parts."""
    if not isinstance(first, list) and not isinstance(second, list):
        return "\n\n".join(t for t in (first, second) if t)
    return [*_parts(first), *_parts(second)]


def _parts(content) -> list:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def replayed_history(history: list[dict], mode: str) -> list[dict]:
    """The stored conversation as sent to the model: earlier turns' reasoning only with ``always``."""
    if mode == "always":
        return history
    return [without_reasoning(m) if m.get("role") == "assistant" else m for m in history]


def without_pictures(prompt: list[dict]) -> tuple[list[dict], int]:
    """``prompt`` with every picture taken out of its messages, and how many there were."""
    out: list[dict] = []
    dropped = 0
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            kept = [part for part in content if not (isinstance(part, dict) and part.get("type") == "image_url")]
            dropped += len(content) - len(kept)
            if len(kept) != len(content):
                texts = [p.get("text", "") for p in kept if isinstance(p, dict) and p.get("type") == "text"]
                message = {**message, "content": "\n".join(texts) if len(texts) == len(kept) else kept}
        out.append(message)
    return out, dropped
