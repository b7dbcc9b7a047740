"""The exact environment of a stdio MCP server: the variables its config names, plus PATH and HOME.

Nothing else of the gateway's own environment (its tokens, keys, ``SWITCHBOARD_*`` settings) is passed
on.  The SDK's stdio client would add HOME, LOGNAME, PATH, SHELL, TERM and USER to whatever it is given,
one reason the gateway starts servers with its own transport (:mod:`gateway.tools_mcp.stdio`), which
hands the process exactly this mapping.
"""

from __future__ import annotations

import os
from typing import Mapping

ALWAYS = ("PATH", "HOME")


def server_environment(env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` plus PATH and HOME from ``inherited`` (default: this process), unless ``env`` sets them."""
    inherited = os.environ if inherited is None else inherited
    out = {name: inherited[name] for name in ALWAYS if name in inherited}
    out.update(env)
    return out
