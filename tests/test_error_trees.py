"""Each package's errors module draws the package's whole error tree, and the drawing stays true.

Every error a package defines (anywhere in it) must derive from the package's root error and be
named in the tree drawn in the docstring of its errors module; a new error that is left out fails here.
"""

import importlib
import pkgutil
import re

import pytest

import adapters
import compression
import compression.errors
import gateway
import gateway.errors
import state
import state.errors
from gateway.cli.common import _JsonError
from gateway.cli.config import ConfigFailure
from gateway.cli.setup.ask import SetupFailed
from state._pg_conn import NotOneStatement


def _import_every_module(package) -> None:
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)


def _subclasses(root: type) -> set[type]:
    found, todo = set(), [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def _drawn(doc: str) -> set[str]:
    """The class names in the tree's lines (a name after the box-drawing branch, or the root)."""
    return set(re.findall(r"^[ \t]+(?:[│ ]*[├└]── )?([A-Z_]\w+)\b", doc, re.MULTILINE))


def _defined_by(package: str, root: type) -> set[type]:
    return {cls for cls in _subclasses(root) if cls.__module__.split(".")[0] == package}


def _every_error_defined_in(package) -> set[type]:
    """Every exception class a module of ``package`` defines at its top level."""
    _import_every_module(package)
    found = set()
    for name, module in list(__import__("sys").modules.items()):
        if module is None or not (name == package.__name__ or name.startswith(package.__name__ + ".")):
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == name:
                found.add(value)
    return found


CASES = [
    (state, state.errors, state.StateError),
    (compression, compression.errors, compression.CompressionError),
    (gateway, gateway.errors, gateway.errors.SwitchboardError),
    (adapters, adapters, gateway.errors.AdapterError),  # the adapters' errors are drawn in adapters/__init__.py
]
# drawn in gateway.errors' docstring as outside the tree: how the CLI exits with a ConfigError's line, and
# how it prints an error under --json; in state.errors' docstring, the PostgreSQL engine's signal to itself
OUTSIDE_THE_TREE = {ConfigFailure, _JsonError, SetupFailed, NotOneStatement}


@pytest.mark.parametrize("package, errors, root", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_the_drawn_tree_names_every_error_the_package_defines(package, errors, root):
    _import_every_module(package)
    drawn = _drawn(errors.__doc__)
    missing = sorted(f"{cls.__module__}.{cls.__name__}" for cls in _defined_by(package.__name__, root)
                     if cls.__name__ not in drawn)
    assert missing == [], f"add these to the tree in {errors.__name__}'s docstring"
    assert root.__name__ in drawn


@pytest.mark.parametrize("package, errors, root", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_every_error_the_package_defines_derives_from_its_root(package, errors, root):
    strays = sorted(f"{cls.__module__}.{cls.__name__}" for cls in _every_error_defined_in(package)
                    if not issubclass(cls, root) and cls not in OUTSIDE_THE_TREE)
    assert strays == []


@pytest.mark.parametrize("package, errors, root", CASES[:3], ids=lambda v: getattr(v, "__name__", ""))
def test_every_error_in_the_errors_module_is_exported_from_the_package(package, errors, root):
    defined = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__}
    assert sorted(defined - set(getattr(package, "__all__", dir(package)))) == []
