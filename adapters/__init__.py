"""One package per platform, each on its platform's own library.

A package's ``config`` module holds its settings model; the gateway loads it
through the ``switchboard.adapter_configs`` entry point without loading the
platform's library, so each package imports its adapter lazily
(:func:`lazy_exports`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a name to the submodule
    (``".adapter"``) it is imported from on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
