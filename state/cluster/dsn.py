"""Connection strings shown to people: the password never leaves this module."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>^[a-z][a-z0-9+.-]*://[^:/@?#]*:)(?P<secret>[^@/?#]*)(?P<tail>@)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#]*)", re.I)


def mask_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***``: URL (``postgresql://u:pw@h/db``, ``?password=``)
    or key/value (``host=h password=pw``) form, for logs and error messages."""
    if "://" in dsn:
        return _QUERY_PASSWORD.sub(r"\g<head>***", _URL_PASSWORD.sub(r"\g<head>***\g<tail>", dsn))
    return _KV_PASSWORD.sub(r"\g<head>***", dsn)
