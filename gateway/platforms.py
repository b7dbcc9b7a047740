"""Which chat platforms are installed: the names every part of the gateway accepts.

    installed_platforms()        # ("telegram", "discord", "slack", "email", "matrix") with a matrix package installed

A platform is installed when a package publishes its settings model under the
``switchboard.adapter_configs`` entry point (and its adapter under
``switchboard.adapters``; see pyproject.toml).  Identities, ``auth.allowed_users``,
``sessions.reset.by_platform``, the CLI's platform choices, the dashboard and the
daemon all read the names from here, so a platform shipped as its own package can be
named wherever a built-in one can.

The settings entry points name the platforms because ``platforms.<name>`` is where a
platform is configured: a package that published an adapter alone could never be
turned on.  Only the names are read here; nothing is imported.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import Iterable

__all__ = ["ADAPTERS", "ADAPTER_CONFIGS", "BUILT_IN", "OTHER_SOURCES", "in_platform_order", "installed_platforms",
           "sources"]

ADAPTERS = "switchboard.adapters"
ADAPTER_CONFIGS = "switchboard.adapter_configs"
# The platforms that ship with Switchboard, in the order they are listed everywhere (the order only:
# any other installed platform is named everywhere too, after these, by name).
BUILT_IN: tuple[str, ...] = ("telegram", "discord", "slack", "email", "webhook", "matrix", "whatsapp", "signal", "teams", "lark")
# Where a session comes from besides a platform: the local API, `switchboard chat`, a cron run.
OTHER_SOURCES: tuple[str, ...] = ("api", "cli", "cron")


def in_platform_order(names: Iterable[str]) -> list[str]:
    """``names`` with the built-in platforms first, in their usual order, then the others by name."""
    order = {name: i for i, name in enumerate(BUILT_IN)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))


@functools.cache
def installed_platforms() -> tuple[str, ...]:
    """The installed platforms' names, built-ins first (read once per process)."""
    return tuple(in_platform_order(ep.name for ep in entry_points(group=ADAPTER_CONFIGS)))


def sources() -> tuple[str, ...]:
    """Every source a session may come from: the installed platforms, then :data:`OTHER_SOURCES`."""
    return (*installed_platforms(), *OTHER_SOURCES)
