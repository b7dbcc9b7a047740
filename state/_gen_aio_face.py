"""Writes ``state/_aio_face.pyi``: :class:`state.AsyncSessionDB`'s coroutines, as the type checker sees them.

``AsyncSessionDB`` builds its coroutines at import from :class:`state.SessionDB`'s ``@_reads`` /
``@_writes`` / ``@_upkeep_steps`` marks, which mypy cannot follow.  This script copies each marked
method's signature from ``state/db.py`` into a stub, as an ``async def`` with the same parameters
returning what the method returns; ``aio.py`` inherits it while type checking only.

Run it after changing a marked method::

    .venv/bin/python -m state._gen_aio_face

``tests/test_state_async.py`` regenerates the stub and fails, naming this command, when the
committed one is stale.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

from .db import public_methods

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "db.py"
STUB = HERE / "_aio_face.pyi"
COMMAND = ".venv/bin/python -m state._gen_aio_face"
WIDTH = 120

HEADER = f'''"""The coroutines of :class:`state.AsyncSessionDB`, for the type checker only.

Generated from the marked methods of ``state/db.py``: do not edit, run ``{COMMAND}``.
"""
'''


def _session_db_class(tree: ast.Module) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SessionDB":
            return node
    raise LookupError("state/db.py has no class SessionDB")


def _names_in(annotation: ast.expr) -> set[str]:
    """The top-level names an annotation uses, looking inside quoted ones too."""
    names: set[str] = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= _names_in(ast.parse(node.value, mode="eval").body)
    return names


def _parameters(fn: ast.FunctionDef) -> list[str]:
    """Each parameter as the stub writes it: its annotation kept, any default written ``...``."""
    args = fn.args
    rendered: list[str] = []

    def one(arg: ast.arg, default: bool) -> str:
        text = arg.arg if arg.annotation is None else f"{arg.arg}: {ast.unparse(arg.annotation)}"
        return f"{text} = ..." if default else text

    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        rendered.append(one(arg, i >= first_default))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            rendered.append("/")
    if args.vararg is not None:
        rendered.append("*" + one(args.vararg, False))
    elif args.kwonlyargs:
        rendered.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        rendered.append(one(arg, default is not None))
    if args.kwarg is not None:
        rendered.append("**" + one(args.kwarg, False))
    return rendered


def _coroutine(fn: ast.FunctionDef) -> str:
    returns = "None" if fn.returns is None else ast.unparse(fn.returns)
    params = _parameters(fn)
    line = f"    async def {fn.name}({', '.join(params)}) -> {returns}: ..."
    if len(line) <= WIDTH:
        return line
    inner = "".join(f"        {p},\n" for p in params)
    return f"    async def {fn.name}(\n{inner}    ) -> {returns}: ..."


def _imports(tree: ast.Module, used: set[str]) -> list[str]:
    """``from ... import`` lines for the names the signatures use, taken from db.py's own imports
    (those under ``if TYPE_CHECKING:`` included) or from db.py itself."""
    where: dict[str, str] = {}
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If):  # if TYPE_CHECKING:
            statements.extend(node.body)
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                where[alias.asname or alias.name] = module
        elif isinstance(node, ast.ClassDef):
            where[node.name] = ".db"
    wanted: dict[str, set[str]] = {}
    for name in sorted(used):
        if name in where:
            wanted.setdefault(where[name], set()).add(name)
        elif not hasattr(builtins, name):
            raise LookupError(f"state/db.py uses {name!r} in a signature but does not import it at the top")

    def line(module: str) -> str:
        return f"from {module} import {', '.join(sorted(wanted[module], key=lambda n: (not n.isupper(), n)))}"

    # the order ruff's isort keeps: the standard library, a blank line, then this package's modules
    stdlib = [line(m) for m in sorted(m for m in wanted if not m.startswith("."))]
    local = [line(m) for m in sorted(m for m in wanted if m.startswith("."))]
    return stdlib + ([""] if stdlib and local else []) + local


def render() -> str:
    """The stub's text, from state/db.py as it is now."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    marked = {name for kind in ("read", "write", "upkeep") for name in public_methods(kind)}
    methods = [node for node in _session_db_class(tree).body
               if isinstance(node, ast.FunctionDef) and node.name in marked]
    missing = marked - {fn.name for fn in methods}
    if missing:
        raise LookupError(f"marked methods not found in state/db.py's class body: {sorted(missing)}")
    used: set[str] = set()
    for fn in methods:
        for arg in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            if arg.annotation is not None:
                used |= _names_in(arg.annotation)
        if fn.returns is not None:
            used |= _names_in(fn.returns)
    body = "\n".join(_coroutine(fn) for fn in methods)
    return (f"{HEADER}\n" + "\n".join(_imports(tree, used)) + "\n\nclass AsyncFace:\n"
            '    """SessionDB\'s marked methods, each a coroutine with the same parameters and result."""\n\n'
            f"{body}\n")


def main() -> None:
    text = render()
    if STUB.exists() and STUB.read_text(encoding="utf-8") == text:
        print(f"{STUB.relative_to(HERE.parent)} is up to date")
        return
    STUB.write_text(text, encoding="utf-8")
    print(f"wrote {STUB.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
