"""An MCP tool result as the text the model reads: untrusted, and cut at the server's output cap."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a result exists only once the SDK is loaded (gateway.tools_mcp.server)
    from mcp import types


def result_text(result: types.CallToolResult) -> str:
    """The parts of ``result`` as one text: text as it is, other parts named by what they are."""
    from mcp import types

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'})]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        else:  # images and audio: the model is told what came, not given the bytes
            parts.append(f"[{block.type} ({getattr(block, 'mime_type', None) or 'unknown type'}) not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return f"error: {text or 'the tool failed and said nothing more'}"
    return text


def capped(text: str, max_bytes: int) -> str:
    """``text`` cut to its first ``max_bytes`` bytes of UTF-8 (never inside a character), marked when cut."""
    if len(text) <= max_bytes // 4:  # cannot be longer than the cap in UTF-8: skip the encoding
        return text
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    kept = data[:max_bytes].decode("utf-8", errors="ignore")
    return f"{kept}\n\n[cut: the result was {len(data):,} bytes; only the first {max_bytes:,} are shown]"
