"""How big a prompt is, and how big the model's window is, without a tokenizer.

No tokenizer file is downloaded (the machine may be offline and the model may
be anything behind an OpenAI-compatible endpoint), so the count is an
estimate that errs on the high side:

* Latin text: one token per 3.5 characters, rounded up (real BPE tokenizers
  average about four characters per token in English, fewer in code);
* CJK, kana and hangul: one token per character (real tokenizers use 0.7-1.5);
* every message costs ``MESSAGE_OVERHEAD`` more tokens (role and framing);
* an image part costs ``IMAGE_TOKENS`` (OpenAI's high-detail tile maths tops
  out near that for the sizes adapters pass on).

A counted prompt is better than an estimated one: :func:`prompt_tokens` starts
from the ``usage.prompt_tokens`` the model last reported and only estimates
what was added since.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping, Sequence

CHARS_PER_TOKEN = 3.5
MESSAGE_OVERHEAD = 4
IMAGE_TOKENS = 1_000
DEFAULT_CONTEXT_LENGTH = 8_192
MIN_CONTEXT_LENGTH = 1_024

# Han, kana, hangul and full-width forms: about one token per character.
_WIDE = re.compile(
    "[\u1100-\u11ff\u2e80-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f"
    "\uff00-\uffef\U00020000-\U0003134f]"
)

# Context windows of well-known models, matched on the longest prefix of the
# lower-cased name after any "provider/" part.  Where a family has several
# sizes the smaller one is listed: too small compresses early, too large
# overflows.
CONTEXT_LENGTHS: dict[str, int] = {
    # OpenAI
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "gpt-oss": 131_072,
    # Anthropic (through OpenAI-compatible proxies)
    "claude": 200_000,
    # Google
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.5-flash": 1_048_576,
    "gemini-2": 1_048_576,
    "gemma-2": 8_192,
    "gemma-3": 131_072,
    # Meta
    "llama-2": 4_096,
    "llama2": 4_096,
    "llama-3": 8_192,
    "llama3": 8_192,
    "llama-3.1": 131_072,
    "llama3.1": 131_072,
    "llama-3.2": 131_072,
    "llama3.2": 131_072,
    "llama-3.3": 131_072,
    "llama3.3": 131_072,
    "llama-4": 131_072,
    # Mistral
    "mistral-large": 131_072,
    "mistral-small": 32_768,
    "mistral-medium": 131_072,
    "mistral-nemo": 131_072,
    "open-mistral-nemo": 131_072,
    "mixtral-8x7b": 32_768,
    "mixtral-8x22b": 65_536,
    "codestral": 32_768,
    # Others
    "qwen2": 32_768,
    "qwen2.5": 32_768,
    "qwen3": 32_768,
    "deepseek-chat": 65_536,
    "deepseek-reasoner": 65_536,
    "deepseek-v3": 65_536,
    "deepseek-r1": 65_536,
    "command-r": 128_000,
    "phi-3": 4_096,
    "phi-4": 16_384,
    "grok": 131_072,
}


def estimate_text_tokens(text: str) -> int:
    """Tokens in one string, rounded up; CJK characters count one each."""
    if not text:
        return 0
    if text.isascii():  # the common case, without a regex pass
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    wide = len(_WIDE.findall(text))
    return wide + math.ceil((len(text) - wide) / CHARS_PER_TOKEN)


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return estimate_text_tokens(content)
    if isinstance(content, list):  # OpenAI content parts
        total = 0
        for part in content:
            if not isinstance(part, Mapping):
                total += estimate_text_tokens(str(part))
            elif part.get("type") == "text":
                total += estimate_text_tokens(str(part.get("text") or ""))
            elif part.get("type") in ("image_url", "input_image", "image"):
                total += IMAGE_TOKENS
            else:
                total += estimate_text_tokens(json.dumps(part, ensure_ascii=False, default=str))
        return total
    return estimate_text_tokens(str(content))


def _tool_calls_tokens(tool_calls: Any) -> int:
    if not tool_calls:
        return 0
    if isinstance(tool_calls, str):
        return estimate_text_tokens(tool_calls)
    total = 0
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(fn, Mapping):
            total += MESSAGE_OVERHEAD + estimate_text_tokens(str(fn.get("name") or ""))
            args = fn.get("arguments")
            total += estimate_text_tokens(args if isinstance(args, str) else json.dumps(args, default=str))
            total += estimate_text_tokens(str(call.get("id") or ""))
        else:
            total += estimate_text_tokens(json.dumps(call, ensure_ascii=False, default=str))
    return total


def estimate_message_tokens(message: Mapping[str, Any]) -> int:
    """Tokens one chat message adds to a prompt (content, tool calls, ids, overhead)."""
    # a turn estimates its whole prompt more than once, and most messages are a role and a text: the
    # fields a message lacks cost no call
    tokens = MESSAGE_OVERHEAD + _content_tokens(message.get("content"))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        tokens += _tool_calls_tokens(tool_calls)
    for field in ("tool_call_id", "name"):
        value = message.get(field)
        if value:
            tokens += estimate_text_tokens(str(value))
    return tokens


def estimate_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Estimated prompt tokens of chat messages; errs high, never reads a tokenizer."""
    return sum(estimate_message_tokens(m) for m in messages)


def prompt_tokens(
    messages: Sequence[Mapping[str, Any]],
    *,
    reported_prompt_tokens: int | None = None,
    reported_message_count: int | None = None,
) -> int:
    """The size of the prompt ``messages`` would make.

    ``reported_prompt_tokens`` is the ``usage.prompt_tokens`` the model
    returned for a prompt made of the first ``reported_message_count`` of
    these same messages; only the messages after them are estimated.  Without
    a report (or when the prompt shrank since, e.g. after a split) the whole
    prompt is estimated.
    """
    if (
        reported_prompt_tokens is None
        or reported_message_count is None
        or reported_prompt_tokens < 0
        or not 0 <= reported_message_count <= len(messages)
    ):
        return estimate_tokens(messages)
    return reported_prompt_tokens + estimate_tokens(messages[reported_message_count:])


def _normalize(model_name: str) -> str:
    name = model_name.strip().lower()
    name = name.rsplit("/", 1)[-1]  # "openai/gpt-4o", "meta-llama/llama-3.1-8b"
    name = name.removeprefix("ft:")  # fine-tunes: "ft:gpt-4o-mini:org::id"
    return name.split(":", 1)[0]  # ollama tags: "llama3.1:8b"


def known_context_length(model_name: str) -> int | None:
    """The table's context length for ``model_name`` (longest prefix match), or None."""
    name = _normalize(model_name or "")
    best: str | None = None
    for prefix in CONTEXT_LENGTHS:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return CONTEXT_LENGTHS[best] if best else None


def context_length_for(model_name: str | None, configured: int | None = None) -> tuple[int, str | None]:
    """The model's context length and, when it fell back to the default, a warning to log at start.

    Order: ``configured`` (``model.context_length``), then :data:`CONTEXT_LENGTHS`,
    then :data:`DEFAULT_CONTEXT_LENGTH`.  A configured value below
    :data:`MIN_CONTEXT_LENGTH` raises ``ValueError`` saying what to set.
    """
    if configured is not None:
        if isinstance(configured, bool) or not isinstance(configured, int) or configured < MIN_CONTEXT_LENGTH:
            raise ValueError(
                f"model.context_length must be a whole number of tokens of at least {MIN_CONTEXT_LENGTH}, "
                f"got {configured!r}: set it to the window of {model_name or 'your model'} (e.g. 131072)"
            )
        return configured, None
    known = known_context_length(model_name or "")
    if known is not None:
        return known, None
    return DEFAULT_CONTEXT_LENGTH, (
        f"context length of model {model_name!r} is unknown; assuming {DEFAULT_CONTEXT_LENGTH:,} tokens, "
        "so long conversations are compressed early. Set model.context_length in the config to the "
        "model's real window"
    )


def round_tokens(n: int) -> int:
    """A token estimate as shown to users: 61,240 -> 61,000; 950 -> 1,000 (``~`` goes in front)."""
    if n >= 1_000:
        return round(n, -3)
    if n >= 100:
        return round(n, -2)
    return n


def should_compress(prompt_tokens_estimate: int, context_length: int, threshold: float = 0.75) -> bool:
    """True when the prompt reaches ``threshold`` of the context window."""
    if not 0 < threshold <= 1:
        raise ValueError(f"compression.threshold must be between 0 and 1 (e.g. 0.75), got {threshold!r}")
    return prompt_tokens_estimate >= threshold * context_length
