"""The exact environment of a stdio MCP server: the variables its config names, plus PATH and HOME.

The SDK's stdio client always adds a few variables of the gateway's own environment (HOME, LOGNAME,
PATH, SHELL, TERM, USER) to the one it is given, and offers no way to turn that off.  So the server
is started through a short launcher (this interpreter, isolated, with no site packages) that keeps
only the names it is told, then replaces itself with the server (``execvpe``): the server sees
exactly its ``env`` plus PATH and HOME.  The launcher's argument list carries the variable names,
never their values (an argument list is readable by every user of the machine).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

ALWAYS = ("PATH", "HOME")

_LAUNCHER = (
    "import os, sys\n"
    "keep = set(filter(None, sys.argv[1].split(',')))\n"
    "env = {k: v for k, v in os.environ.items() if k in keep}\n"
    "try:\n"
    "    os.execvpe(sys.argv[2], sys.argv[2:], env)\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'cannot start {sys.argv[2]}: {exc.strerror}\\n')\n"
    "    sys.exit(127)\n"
)


def server_environment(env: Mapping[str, str], inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` plus PATH and HOME from ``inherited`` (default: this process), unless ``env`` sets them."""
    inherited = os.environ if inherited is None else inherited
    out = {name: inherited[name] for name in ALWAYS if name in inherited}
    out.update(env)
    return out


def launch_command(command: str, args: tuple[str, ...] | list[str], env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The (command, args) that runs ``command args`` with exactly ``env`` (names checked by the config)."""
    return sys.executable, ["-I", "-S", "-c", _LAUNCHER, ",".join(sorted(env)), command, *args]
