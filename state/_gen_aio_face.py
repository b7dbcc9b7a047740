"""Writes ``state/_aio_face.pyi``: :class:`state.AsyncSessionDB`'s coroutines, as the type checker sees them.

``AsyncSessionDB`` builds its coroutines at import from the ``@_reads`` / ``@_writes`` /
``@_upkeep_steps`` marks of :class:`state.SessionDB` and of each repository in
``SessionDB.REPOSITORIES`` (``state._repo``), which mypy cannot follow.  This script copies each
marked method's signature into a stub, as an ``async def`` with the same parameters returning what
the method returns: SessionDB's into ``AsyncFace``, which ``aio.py`` inherits while type checking
only, and each repository's into an ``Async<Repository>`` class that ``AsyncFace`` names as the
attribute's type.

Run it after changing a marked method or adding a repository::

    .venv/bin/python -m state._gen_aio_face

``tests/test_state_async.py`` regenerates the stub and fails, naming this command, when the
committed one is stale.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
from pathlib import Path

from ._repo import KINDS, marked_methods
from .db import SessionDB, public_methods

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "db.py"
STUB = HERE / "_aio_face.pyi"
COMMAND = ".venv/bin/python -m state._gen_aio_face"
WIDTH = 120

HEADER = f'''"""The coroutines of :class:`state.AsyncSessionDB`, for the type checker only.

Generated from the marked methods of ``state/db.py`` and its repositories: do not edit, run ``{COMMAND}``.
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


def _relative_to_state(level: int, module: str | None, package: str) -> str:
    """An import's module, ``from`` ``"." * level + module`` in ``package`` (``state``,
    ``state.search``), as seen from ``state`` (``.._dialect`` in ``state.search`` is ``._dialect``)."""
    if level == 0:
        return module or ""
    parts = package.split(".")[: len(package.split(".")) - (level - 1)] + ([module] if module else [])
    absolute = ".".join(parts)
    return "." + absolute.removeprefix("state").lstrip(".") if absolute.startswith("state") else absolute


def _same_object(name: str, one: str, other: str) -> bool:
    """Whether ``name`` from module ``one`` and from ``other`` (relative to ``state``) is the same object."""
    def get(module: str) -> object:
        return getattr(importlib.import_module(module, "state") if module.startswith(".") else
                       importlib.import_module(module), name, None)

    return get(one) is get(other) is not None


def _where_names_come_from(tree: ast.Module, module: str, package: str = "state") -> dict[str, str]:
    """Each name a module imports at the top (those under ``if TYPE_CHECKING:`` included) or
    defines as a class, with the module (relative to ``state``) to import it from; ``package`` is
    the one the module's own relative imports start from."""
    where: dict[str, str] = {}
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If):  # if TYPE_CHECKING:
            statements.extend(node.body)
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = _relative_to_state(node.level, node.module, package)
            for alias in node.names:
                where[alias.asname or alias.name] = source
        elif isinstance(node, ast.ClassDef):
            where[node.name] = module
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):  # ``Claim = Literal[...]``
            where.update((target.id, module) for target in node.targets if isinstance(target, ast.Name))
    return where


def _imports(where: dict[str, str], used: set[str]) -> list[str]:
    """``from ... import`` lines for the names the signatures use."""
    wanted: dict[str, set[str]] = {}
    for name in sorted(used):
        if name in where:
            wanted.setdefault(where[name], set()).add(name)
        elif not hasattr(builtins, name):
            raise LookupError(f"a store method uses {name!r} in a signature but its module does not import it "
                              "at the top")

    def line(module: str) -> str:
        return f"from {module} import {', '.join(sorted(wanted[module], key=lambda n: (not n.isupper(), n)))}"

    # the order ruff's isort keeps: the standard library, a blank line, then this package's modules
    stdlib = [line(m) for m in sorted(m for m in wanted if not m.startswith("."))]
    local = [line(m) for m in sorted(m for m in wanted if m.startswith("."))]
    return stdlib + ([""] if stdlib and local else []) + local


def _class_named(tree: ast.Module, name: str, path: Path) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{path.name} has no class {name}")


def _marked_defs(cls_node: ast.ClassDef, marked: set[str], path: Path) -> list[ast.FunctionDef]:
    methods = [node for node in cls_node.body if isinstance(node, ast.FunctionDef) and node.name in marked]
    missing = marked - {fn.name for fn in methods}
    if missing:
        raise LookupError(f"marked methods not found in {path.name}'s class {cls_node.name}: {sorted(missing)}")
    return methods


def _used_names(methods: list[ast.FunctionDef]) -> set[str]:
    used: set[str] = set()
    for fn in methods:
        for arg in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            if arg.annotation is not None:
                used |= _names_in(arg.annotation)
        if fn.returns is not None:
            used |= _names_in(fn.returns)
    return used


def render() -> str:
    """The stub's text, from state/db.py and the repositories' modules as they are now."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    where = _where_names_come_from(tree, ".db")
    marked = {name for kind in KINDS for name in public_methods(kind)}
    methods = _marked_defs(_session_db_class(tree), marked, SOURCE)
    used = _used_names(methods)
    classes: list[str] = []
    attributes: list[str] = []
    for attribute, repository in SessionDB.REPOSITORIES.items():
        path = Path(inspect.getfile(repository))
        module = "." + repository.__module__.removeprefix("state.")
        package = repository.__module__ if path.name == "__init__.py" else repository.__module__.rpartition(".")[0]
        repo_tree = ast.parse(path.read_text(encoding="utf-8"))
        repo_marked = {name for kind in KINDS for name in marked_methods(repository, kind)}
        repo_methods = _marked_defs(_class_named(repo_tree, repository.__name__, path), repo_marked, path)
        for name, source in _where_names_come_from(repo_tree, module, package).items():
            if name in where and where[name] != source and not _same_object(name, where[name], source):
                raise LookupError(f"{name!r} means {where[name]} in one store module and {source} in {path.name}")
            if name not in where or len(source) < len(where[name]):
                where[name] = source  # the same object through two modules: the shorter path
        used |= _used_names(repo_methods)
        doc = f'    """{repository.__name__}\'s marked methods (``adb.{attribute}``), each a coroutine."""\n\n'
        classes.append(f"class Async{repository.__name__}:\n{doc}" + "\n".join(_coroutine(fn) for fn in repo_methods)
                       + "\n")
        attributes.append(f"    {attribute}: Async{repository.__name__}")
    body = "\n".join(_coroutine(fn) for fn in methods)
    face = ("class AsyncFace:\n"
            '    """SessionDB\'s marked methods, each a coroutine with the same parameters and result, and its\n'
            '    repositories, whose marked methods are coroutines too."""\n\n'
            + "".join(f"{line}\n" for line in attributes) + ("\n" if attributes else "") + f"{body}\n")
    return f"{HEADER}\n" + "\n".join(_imports(where, used)) + "\n\n" + "\n\n".join(classes + [face])


def main() -> None:
    text = render()
    if STUB.exists() and STUB.read_text(encoding="utf-8") == text:
        print(f"{STUB.relative_to(HERE.parent)} is up to date")
        return
    STUB.write_text(text, encoding="utf-8")
    print(f"wrote {STUB.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
