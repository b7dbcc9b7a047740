"""Secrets out of everything that goes to, or comes back from, the summarizer.

A summary is a new piece of text that outlives the messages it replaces (it
is copied into every later session of the chain and fed back to the model at
each compression), so a key pasted once must not be carried forward in it.
Each match is replaced by ``[REDACTED]``; for ``name: value`` pairs the name
stays so the summary can still say *which* secret the user gave.

The messages themselves are not touched: the head and tail are copied
verbatim and the parent session keeps its full history.

The token shapes here are the project's one catalogue of them:
:func:`redact_tokens` masks just those, with any mask, and the gateway's logs
use it (``gateway.logging_setup``, with ``***``) besides their own config
secrets and HTTP contexts.

Speed matters (the middle of a long session is a few hundred kilobytes of
text and ``re`` tries a pattern at every position unless it can skip ahead
to a literal): each token shape runs only when its literal prefix occurs in
the text, ``name: value`` pairs are found from their separator, and
``Bearer <x>`` / ``password is <x>`` from the word, located with
``str.find`` on a lower-cased copy.  Word-boundary checks are done on the
match (a leading ``\\b`` or look-behind would stop the skipping).
"""

from __future__ import annotations

import functools
import re

REDACTED = "[REDACTED]"
_NO_REDACTED = r"(?!\[REDACTED\])"


def _after_word_char(text: str, index: int) -> bool:
    """True when the character before ``index`` is a letter or digit."""
    return index > 0 and text[index - 1].isalnum()


# --- whole-token secrets, recognisable by their shape --------------------------------

# (literals one of which must occur, the pattern, led by that literal)
_SHAPES: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
    (("-----BEGIN",), re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)")),
    (("sk-",), re.compile(r"sk-(?:ant-|proj-|svcacct-|or-v1-)?[A-Za-z0-9_\-]{16,}")),  # OpenAI, Anthropic
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}")),  # GitHub
    (("github_pat_",), re.compile(r"github_pat_[A-Za-z0-9_]{20,}")),
    (("glpat-",), re.compile(r"glpat-[A-Za-z0-9_\-]{20,}")),  # GitLab
    (("xox",), re.compile(r"xox[abeoprs]-[A-Za-z0-9\-]{8,}")),  # Slack bot/user/refresh tokens
    (("xapp-",), re.compile(r"xapp-[A-Za-z0-9\-]{8,}")),  # Slack app-level tokens
    (("AKIA", "ASIA"), re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Za-z])")),  # AWS key ids
    (("AIza",), re.compile(r"AIza[0-9A-Za-z_\-]{35}")),  # Google API keys
    (("hf_",), re.compile(r"hf_[A-Za-z0-9]{30,}")),  # Hugging Face
    (("eyJ",), re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),  # JWTs
]


def _whole_token(m: re.Match[str], mask: str) -> str:
    start = m.start()
    if start > 0 and (m.string[start - 1].isalnum() or m.string[start - 1] in "_-"):
        return m.group(0)  # "task-abc..." is not an "sk-" key
    return mask


# Telegram bot tokens (123456789:AA...) are found from their colon, Discord bot
# tokens (<24-27 chars>.<6>.<27+>) from their first dot; the part before is
# checked on the match, then removed with the rest.  A Telegram token may follow
# "bot" (the Bot API's URLs: /bot<token>/getMe).
_TELEGRAM = re.compile(r":[A-Za-z0-9_\-]{30,40}(?![A-Za-z0-9_\-])")
_TELEGRAM_BEFORE = r"(?:(?<![0-9A-Za-z])|(?<=bot))\d{3,15}"
_TELEGRAM_ID = re.compile(_TELEGRAM_BEFORE + "$")
_DISCORD = re.compile(r"\.[A-Za-z\d_\-]{6}\.[A-Za-z\d_\-]{27,40}(?![A-Za-z\d_\-])")
_DISCORD_BEFORE = r"(?<![A-Za-z\d_\-])[MNO][A-Za-z\d_\-]{23,27}"
_DISCORD_ID = re.compile(_DISCORD_BEFORE + "$")


@functools.lru_cache(maxsize=8)
def _done(mask: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The Telegram and Discord patterns for a token whose secret part is already ``mask``."""
    return (re.compile(_TELEGRAM_BEFORE + ":" + re.escape(mask)),
            re.compile(_DISCORD_BEFORE + r"\." + re.escape(mask)))


def _telegram(m: re.Match[str], mask: str) -> str:
    found = _TELEGRAM_ID.search(m.string, max(0, m.start() - 16), m.start())
    return ":" + mask if found else m.group(0)


def _discord(m: re.Match[str], mask: str) -> str:
    found = _DISCORD_ID.search(m.string, max(0, m.start() - 29), m.start())
    return "." + mask if found else m.group(0)


def redact_tokens(text: str, mask: str = REDACTED) -> str:
    """``text`` with every token of a known shape (API keys, platform bot tokens, private keys, JWTs)
    replaced by ``mask``; nothing else is touched."""
    if not text:
        return text
    for literals, pattern in _SHAPES:
        if any(literal in text for literal in literals):
            text = pattern.sub(lambda m: _whole_token(m, mask), text)
    telegram_done, discord_done = _done(mask)
    if ":" in text:
        text = _TELEGRAM.sub(lambda m: _telegram(m, mask), text)
        if ":" + mask in text:
            text = telegram_done.sub(mask, text)
    if "." in text:
        text = _DISCORD.sub(lambda m: _discord(m, mask), text)
        if "." + mask in text:
            text = discord_done.sub(mask, text)
    return text


# --- credentials in URLs: scheme://user:password@host -----------------------------

_URL_CREDENTIALS = re.compile(r"://([^\s:/@]+):([^\s@/]+)@")

# --- name = value / name: value / "name": "value" --------------------------------

# The secret word must start the name or follow "_"/"-", and end it or be
# followed by "_"/"-": "DB_PASSWORD=x" and "api_key: x" are secrets,
# "max_tokens: 4000" and "secretary: Bob" are not.
_SECRET_NAME = re.compile(
    r"(?i)(?:[\w\-]*[_\-])?"
    r"(?:password|passwd|passphrase|passcode|pwd|secret|token|api[_\-]?key|apikey|access[_\-]?key"
    r"|private[_\-]?key|client[_\-]?secret|credentials?)"
    r"(?:[_\-][\w\-]*)?"
)
_SEPARATED_VALUE = re.compile(r"([:=]\s*[\"']?)" + _NO_REDACTED + r"([^\s\"',;]{3,})")


def _key_value(m: re.Match[str]) -> str:
    text, end = m.string, m.start()
    while end > 0 and text[end - 1] in " \t":
        end -= 1
    if end > 0 and text[end - 1] in "\"'":
        end -= 1
    start = end
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_-"):
        start -= 1
    if start == end or not _SECRET_NAME.fullmatch(text, start, end):
        return m.group(0)
    return m.group(1) + REDACTED


# --- a word, then the secret: "Bearer abc1...", "my password is hunter2" ----------

# A credential after bearer/basic/token has a digit or one of = + / (so
# "token authentication" is left alone).
_AUTH_WORDS = ("bearer", "basic", "token")
_AUTH_VALUE = re.compile(r"\s+(?=[A-Za-z0-9_\-\.=+/]*[0-9=+/])([A-Za-z0-9_\-\.=+/]{12,})")
# "is"/"was" only after words that cannot mean anything but a password.
_PASSWORD_WORDS = ("password", "passwd", "passphrase", "passcode")
_PASSWORD_VALUE = re.compile(r"\s+(?:is|was|=)\s+[\"']?" + _NO_REDACTED + r"([^\s\"',;]{3,})")


_WORD_RULES = ((_AUTH_WORDS, _AUTH_VALUE), (_PASSWORD_WORDS, _PASSWORD_VALUE))


def _after_words(text: str) -> str:
    """Replace group 1 of a rule's pattern wherever it matches right after one of its words (any case)."""
    spans: list[tuple[int, int]] = []
    low = text.lower()
    for words, value in _WORD_RULES:
        if len(low) != len(text):  # a character whose lower case is longer: offsets differ, use re
            for m in re.finditer("|".join(words), text, re.IGNORECASE):
                if not _after_word_char(text, m.start()):
                    found = value.match(text, m.end())
                    if found:
                        spans.append(found.span(1))
            continue
        for word in words:
            at = low.find(word)
            while at != -1:
                if not _after_word_char(low, at):
                    found = value.match(text, at + len(word))
                    if found:
                        spans.append(found.span(1))
                at = low.find(word, at + len(word))
    if not spans:
        return text
    out, last = [], 0
    for start, end in sorted(spans):
        if start < last:
            continue
        out.append(text[last:start])
        out.append(REDACTED)
        last = end
    out.append(text[last:])
    return "".join(out)


def redact(text: str) -> str:
    """``text`` with keys, tokens, passwords and URL credentials replaced by ``[REDACTED]``."""
    if not text:
        return text
    text = redact_tokens(text)
    if "://" in text:
        text = _URL_CREDENTIALS.sub(lambda m: f"://{m.group(1)}:{REDACTED}@", text)
    text = _after_words(text)
    if ":" in text or "=" in text:
        text = _SEPARATED_VALUE.sub(_key_value, text)
    return text
