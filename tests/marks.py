"""Which tests `make test-fast` leaves out, marked from what each test uses, so that a new test file
needs no marks of its own:

  postgresql  it runs on the throw-away PostgreSQL server (pg_cluster, pg_url, a "postgresql"
              parameter such as store_target's, tests/pgserver.py);
  processes   it starts another process: a real daemon, a kill test, a CLI, initdb,
              systemd-analyze, the sandbox (found in the code of the test, of its fixtures and of
              the helpers in tests/ they call: subprocess, asyncio.create_subprocess_*, fork);
  browser     it drives chromium (the code uses playwright).

Each of them is also ``slow``; `make test-fast` runs ``-m "not slow"``.  What the product does
in-process is not followed: a test of ours that is slow for another reason (it waits out real
timers, or runs many examples) says so itself with ``@pytest.mark.slow`` and a comment.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import types
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent) + os.sep
_SPAWN_NAMES = frozenset({"subprocess", "create_subprocess_exec", "create_subprocess_shell", "fork", "forkpty",
                          "posix_spawn", "multiprocessing", "pty"})


def _ours(module: types.ModuleType | None) -> bool:
    """Whether ``module`` is a file under tests/ (test modules are imported by file name, helpers as tests.x)."""
    return str(getattr(module, "__file__", None) or "").startswith(_TESTS)


@functools.cache
def _imported_inside(name: str) -> types.ModuleType | None:
    """The module of ``from tests.x import y`` in a function's body (its code names ``tests.x``)."""
    if name in sys.modules or not name.startswith("tests."):
        return sys.modules.get(name)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _what_code_uses(code: types.CodeType, namespace: dict, found: set[str], seen: set[int]) -> None:
    if id(code) in seen:
        return
    seen.add(id(code))
    names = set(code.co_names)
    if names & _SPAWN_NAMES:
        found.add("processes")
    if any(name == "playwright" or name.startswith("playwright.") for name in names):
        found.add("browser")
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _what_code_uses(const, namespace, found, seen)
    for name in names:
        target = namespace.get(name) or _imported_inside(name)
        if target is not None:
            _what_object_uses(target, found, seen, names)


def _what_object_uses(target, found: set[str], seen: set[int], names: set[str] = frozenset()) -> None:
    if isinstance(target, types.ModuleType):
        module = target.__name__
        if module == "subprocess" or module == "multiprocessing":
            found.add("processes")
        elif module == "tests.pgserver":
            found.add("postgresql")
        elif module.startswith("playwright"):
            found.add("browser")
        elif _ours(target):  # `from tests import crashkit` ... crashkit.Daemon(...)
            for name in names:
                attribute = getattr(target, name, None)
                if attribute is not None and not isinstance(attribute, types.ModuleType):
                    _what_object_uses(attribute, found, seen)
        return
    module = getattr(target, "__module__", None) or ""
    if module.startswith("playwright"):
        found.add("browser")
    if module == "tests.pgserver":
        found.add("postgresql")
    if module in ("subprocess", "multiprocessing") or getattr(target, "__name__", "") in _SPAWN_NAMES:
        found.add("processes")
    if not _ours(sys.modules.get(module)):  # tests/ only: what the product does in-process is not slow
        return
    if id(target) in seen:
        return
    seen.add(id(target))
    done = _USES.get(id(target))
    if done is not None and done[0] is target:
        found |= done[1]
        return
    if inspect.isclass(target):
        for base in target.__mro__:
            if _ours(sys.modules.get(base.__module__)):
                for member in vars(base).values():
                    member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                    if isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member):
                        _what_object_uses(member, found, seen)
        return
    function = inspect.unwrap(target) if callable(target) else None
    code = getattr(function, "__code__", None)
    if code is not None:
        _what_code_uses(code, function.__globals__, found, seen)


_USES: dict[int, tuple[object, frozenset[str]]] = {}  # id -> (object, what it and all it calls use)


def _uses(target) -> frozenset[str]:
    done = _USES.get(id(target))
    if done is None or done[0] is not target:
        found: set[str] = set()
        _what_object_uses(target, found, set())
        done = _USES[id(target)] = (target, frozenset(found))
    return done[1]


def _what_item_uses(item) -> set[str]:
    found: set[str] = set()
    function = getattr(item, "obj", None)
    inner = getattr(getattr(function, "hypothesis", None), "inner_test", None)  # @given wraps the test
    for target in (function, inner):
        if target is not None:
            found |= _uses(target)
    info = getattr(item, "_fixtureinfo", None)
    for name, definitions in (info.name2fixturedefs.items() if info else ()):
        if name == "pg_cluster":
            found.add("postgresql")
        for definition in definitions:
            found |= _uses(definition.func)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(value == "postgresql" for value in params.values()):
        found.add("postgresql")
    return found


def mark_from_what_they_use(items) -> None:
    """Add the marks of what each test uses, and ``slow`` where there is one."""
    for item in items:
        for marker in sorted(_what_item_uses(item)):
            item.add_marker(marker)
        if item.get_closest_marker("postgresql") or item.get_closest_marker("processes") \
                or item.get_closest_marker("browser"):
            item.add_marker("slow")
