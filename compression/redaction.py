"""Secrets out of everything that goes to, or comes back from, the summarizer.

A summary is a new piece of text that outlives the messages it replaces (it
is copied into every later session of the chain and fed back to the model at
each compression), so a key pasted once must not be carried forward in it.
Each match is replaced by ``[REDACTED]``; for ``name: value`` pairs the name
stays so the summary can still say *which* secret the user gave.

The messages themselves are not touched: the head and tail are copied
verbatim and the parent session keeps its full history.
"""

from __future__ import annotations

import re

REDACTED = "[REDACTED]"

# Whole-token secrets recognisable by their shape.
_TOKEN_PATTERNS = [
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)",
    r"\bsk-(?:ant-|proj-|svcacct-|or-v1-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic, OpenRouter
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bglpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack bot/user tokens
    r"\bxapp-[A-Za-z0-9\-]{10,}",  # Slack app-level tokens
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\bAIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"\bhf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"\b\d{8,10}:[A-Za-z0-9_\-]{30,40}\b",  # Telegram bot tokens
    r"\b[MNO][A-Za-z\d_\-]{23,27}\.[A-Za-z\d_\-]{6}\.[A-Za-z\d_\-]{27,40}\b",  # Discord bot tokens
    r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
]
_TOKENS = re.compile("|".join(f"(?:{p})" for p in _TOKEN_PATTERNS))

# "Authorization: Bearer abc", "Basic dXNlcjpwYXNz"
_AUTH_HEADER = re.compile(r"(?i)\b(bearer|basic|token)(\s+)([A-Za-z0-9_\-\.=+/]{12,})")

# Credentials inside URLs: scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"([a-z][a-z0-9+.\-]*://[^\s:/@]+:)([^\s@/]+)(@)", re.IGNORECASE)

# name = value / name: value / "name": "value" for names that hold secrets.  The
# secret word must end the name or be followed by "_"/"-", so "max_tokens: 4000"
# and "secretary: Bob" are left alone.
_SECRET_NAME = (
    r"(?:password|passwd|passphrase|passcode|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|client[_\-]?secret|credentials?)"
)
_KEY_VALUE = re.compile(
    r"(?i)(\b(?:[\w\-]*[_\-])?" + _SECRET_NAME + r"(?:[_\-][\w\-]*)?\b[\"']?)"  # the name
    r"(\s*[:=]\s*[\"']?)"  # the separator
    r"(?!\[REDACTED\])([^\s\"',;]{3,})"  # the value
)
# "my password is hunter2": only for words that cannot mean anything else.
_PASSWORD_IS = re.compile(
    r"(?i)(\b(?:password|passwd|passphrase|passcode)\b)(\s+(?:is|was|=)\s+[\"']?)(?!\[REDACTED\])([^\s\"',;]{3,})"
)


def redact(text: str) -> str:
    """``text`` with keys, tokens, passwords and URL credentials replaced by ``[REDACTED]``."""
    if not text:
        return text
    text = _TOKENS.sub(REDACTED, text)
    text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _KEY_VALUE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _PASSWORD_IS.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return text
