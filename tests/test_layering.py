"""Dependencies point one way: adapters -> gateway -> state, compression."""

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# package -> packages it must never import
FORBIDDEN = {
    "state": {"gateway", "adapters", "compression"},
    "compression": {"gateway", "adapters"},
    "gateway": {"adapters"},
}
# adapters may import only these gateway modules (the boundary types and shared helpers, such as the
# one redaction that keeps tokens out of logs)
ADAPTER_ALLOWED_GATEWAY = {"gateway.types", "gateway.errors", "gateway.retry", "gateway.ratelimit", "gateway.config",
                           "gateway.formatting", "gateway.markdown", "gateway.logging_setup", "gateway.tasks"}


# The message path and what it shares with every part live directly in gateway/; the daemon's runtime,
# cron, memory and the CLI sit beside it in subpackages and use it, never the other way round.
BESIDE_THE_MESSAGE_PATH = ("gateway.runtime", "gateway.cron", "gateway.memory", "gateway.cli", "gateway.tools_mcp")


def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's syntax tree (each text parsed once: the rules below walk the same files)."""
    return _walked(path.read_text(encoding="utf-8"))


@functools.cache
def _walked(text: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(text)))


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, with ``from a import b`` counted as both ``a`` and ``a.b``."""
    names: set[str] = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_lower_layers_never_import_upper_ones():
    offenders = []
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for name in _imports(path):
                if name.split(".")[0] in forbidden:
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_adapters_only_touch_the_gateway_boundary():
    offenders = []
    for path in (ROOT / "adapters").rglob("*.py"):
        for name in _imports(path):
            if name.split(".")[0] == "gateway" and not _within(name, ADAPTER_ALLOWED_GATEWAY):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_no_adapter_imports_another_adapter():
    # what two platforms share (a Markdown subset, a retry rule) lives in the gateway, so each adapter
    # package can be installed, changed and removed alone
    packages = sorted(p for p in (ROOT / "adapters").iterdir() if (p / "__init__.py").exists())
    names = {p.name for p in packages}
    offenders = []
    for package in packages:
        for path in package.rglob("*.py"):
            for name in _imports(path):
                parts = name.split(".")
                if parts[0] == "adapters" and len(parts) > 1 and parts[1] in names - {package.name}:
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_no_adapter_writes_sql():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "adapters").rglob("*.py")
        if "sqlite3" in _imports(path) or "state" in {n.split(".")[0] for n in _imports(path)}
    ]
    assert offenders == []


def test_the_message_path_never_imports_what_sits_beside_it():
    offenders = []
    for path in (ROOT / "gateway").glob("*.py"):
        for name in _imports(path):
            if _within(name, BESIDE_THE_MESSAGE_PATH):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_cron_memory_and_tools_never_import_the_runtime_or_the_cli():
    offenders = []
    for package in ("cron", "memory", "tools_mcp"):
        for path in (ROOT / "gateway" / package).rglob("*.py"):
            for name in _imports(path):
                if _within(name, ("gateway.runtime", "gateway.cli")):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_nothing_outside_the_store_imports_its_private_modules():
    """``state._*`` is the store's inside; everything else uses what ``state`` exports.

    Tests are left out on purpose: a white-box test of the store may reach a private module.
    """
    offenders = []
    for package in ("gateway", "adapters", "compression", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            for name in _imports(path):
                if name.startswith("state._"):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


PRODUCT = ("gateway", "adapters", "state", "compression")


def _product_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the product packages: dotted name -> (file, whether it is a package's __init__).
    A stub with no module beside it (``state/_aio_face.pyi``, read by the type checker only) counts too."""
    found = {}
    for package in PRODUCT:
        paths = list((ROOT / package).rglob("*.py"))
        paths += [p for p in (ROOT / package).rglob("*.pyi") if not p.with_suffix(".py").exists()]
        for path in paths:
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports anywhere in its file (inside functions too), relative
    imports resolved; ``from a import b`` counts ``a.b`` when that is a module, else ``a``.  Importing
    ``a.b`` runs ``a/__init__`` first, but that is no edge: only what a file names counts."""
    modules = _product_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        package = module if is_package else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _nodes(path):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (resolve(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets.update(filter(None, (resolve(f"{source}.{alias.name}") for alias in node.names)))
        graph[module] = targets - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles_among_the_product_packages():
    """Function-level imports count: an import put inside a function to dodge a cycle still is one."""
    graph = _import_graph()
    described = [" -> ".join(cycle) + "  (" + "; ".join(
        f"{m} imports {', '.join(sorted(graph[m] & set(cycle)))}" for m in cycle) + ")" for cycle in _cycles(graph)]
    assert described == []


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    graph = _import_graph()
    assert "state.schema" in graph["state._pg"]  # imported only inside a method, and seen


def test_the_runtime_never_holds_the_stores_url():
    """The daemon opens the store from its config (``store_target``); owners, leases, cron ticks and
    rate budgets come from the opened store's ``cluster``, so no runtime module reads ``store.url``."""
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "gateway" / "runtime").rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "store.url" in line and not line.lstrip().startswith("#")]
    assert offenders == []


def test_the_gateway_opens_no_database_connection_itself():
    """Connections to the store are opened by ``state`` (the engine's pool, ``db.cluster``'s owners and
    rate budgets); the gateway makes none of its own."""
    opening = ("psycopg.connect", "AsyncConnection.connect", "ConnectionPool(", "ConnectionOwner(", "PgBuckets(")
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "gateway").rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if any(word in line for word in opening)]
    assert offenders == []


# A class of the store or the gateway with more public methods than this is growing into a god
# object: split it (the store's features hang off it as repositories, state/_repo.py).
MAX_PUBLIC_METHODS = 20


def _public_methods_per_class(packages=("state", "gateway")) -> dict[str, set[str]]:
    """``path:Class`` -> the public methods it defines or inherits from classes of these packages
    (by name; the generated ``state/_aio_face.pyi`` included, since AsyncSessionDB inherits it)."""
    own: dict[str, tuple[str, set[str], list[str]]] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py*")):
            if path.suffix not in (".py", ".pyi"):
                continue
            for node in _nodes(path):
                if isinstance(node, ast.ClassDef):
                    methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and not n.name.startswith("_")}
                    bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                             if isinstance(b, (ast.Name, ast.Attribute))]
                    own[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = (node.name, methods, bases)
    by_name: dict[str, list[str]] = {}
    for key, (name, _, _) in own.items():
        by_name.setdefault(name, []).append(key)

    def every(key: str, seen: frozenset[str] = frozenset()) -> set[str]:
        _, methods, bases = own[key]
        out = set(methods)
        for base in bases:
            for base_key in by_name.get(base, []):
                if base_key not in seen and base_key != key:
                    out |= every(base_key, seen | {key})
        return out

    return {key: every(key) for key in own}


def test_no_class_of_the_store_or_the_gateway_has_more_than_20_public_methods():
    counts = {key: len(methods) for key, methods in _public_methods_per_class().items()}
    assert {key: n for key, n in counts.items() if n > MAX_PUBLIC_METHODS} == {}


def test_the_public_method_count_sees_the_store_and_its_repositories():
    found = _public_methods_per_class()
    assert {"get", "create", "lineage"} <= found["state/_sessions.py:Sessions"]
    assert {"add_job", "list_jobs"} <= found["state/_cron.py:CronJobs"]
    assert "close" in found["state/db.py:SessionDB"]
    assert {"checkpoint", "close"} <= found["state/aio.py:AsyncSessionDB"]


def test_an_adapters_config_model_loads_no_store():
    """``import adapters.<name>.config`` (what reading the config needs) loads no ``state`` module: the
    config is checked before any store is opened, and a config check opens none."""
    import subprocess
    import sys

    names = sorted(p.parent.name for p in (ROOT / "adapters").glob("*/config.py"))
    assert names, "no adapter config modules found"
    probe = ("import sys\n" + "".join(f"import adapters.{n}.config\n" for n in names) +
             "print(sorted(m for m in sys.modules if m == 'state' or m.startswith('state.')))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


# The router (gateway/router/) is built and run by the composition root alone; everything else sees
# a narrow protocol that lives outside it (gateway.control.ChatControl for the commands and the
# approvals, gateway.control.Requests for the local API and the terminal chat, turn_claims.ClaimRunner,
# reload.Rerouted), so no run-time cycle goes through it.
ROUTER_HOLDERS = {"gateway/runtime/assemble.py", "gateway/runtime/daemon.py"}


def _names_the_router(path: Path) -> bool:
    """Whether ``path`` imports ``gateway.router`` anywhere, under ``TYPE_CHECKING`` and in functions too."""
    for node in _nodes(path):
        if isinstance(node, ast.Import) and any(_within(a.name, ("gateway.router",)) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if _within(node.module, ("gateway.router",)) or \
                    (node.module == "gateway" and any(a.name == "router" for a in node.names)):
                return True
    return False


def test_nothing_outside_the_router_and_the_composition_root_imports_it():
    offenders = [str(path.relative_to(ROOT)) for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
                 if not path.is_relative_to(ROOT / "gateway" / "router") and _names_the_router(path)]
    assert sorted(set(offenders) - ROUTER_HOLDERS) == []


def test_no_module_takes_the_router_object():
    """No constructor or function outside the router and the composition root has a parameter typed
    ``SessionRouter`` (a run-time cycle the import graph would not show): they take a protocol."""
    offenders = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if path.is_relative_to(ROOT / "gateway" / "router") or rel in ROUTER_HOLDERS:
                continue
            for node in _nodes(path):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for arg in [*node.args.args, *node.args.kwonlyargs]:
                        if arg.annotation is not None and "SessionRouter" in ast.unparse(arg.annotation):
                            offenders.append(f"{rel}:{node.name}({arg.arg})")
    assert offenders == []


def test_no_set_router_or_late_wiring_of_the_router():
    offenders = [str(path.relative_to(ROOT)) for package in PRODUCT for path in (ROOT / package).rglob("*.py")
                 if "def set_router" in path.read_text(encoding="utf-8")
                 or ".set_router(" in path.read_text(encoding="utf-8")]
    assert offenders == []


def test_the_router_finder_sees_every_form_of_import(tmp_path):
    for source in ("import gateway.router\n", "from gateway.router import SessionRouter\n",
                   "from gateway import router\n", "from gateway.router.lanes import Lane\n",
                   "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.router import Ticket\n",
                   "def f():\n    from gateway.router import Ticket\n"):
        (tmp_path / "m.py").write_text(source)
        assert _names_the_router(tmp_path / "m.py"), source
    (tmp_path / "m.py").write_text("from gateway.control import ChatControl\nimport gateway.routerless\n")
    assert not _names_the_router(tmp_path / "m.py")


# No module on the message path (the router's parts, the turn, the local API) grows past this: split it
# by what changes together (#37), not by squeezing lines.
MAX_MESSAGE_PATH_LINES = 600
MESSAGE_PATH = ("gateway/router/*.py", "gateway/turn*.py", "gateway/runtime/api*.py", "gateway/runtime/responses*.py")


def test_no_module_on_the_message_path_is_over_600_lines():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for pattern in MESSAGE_PATH for path in ROOT.glob(pattern)}
    assert {"gateway/turn.py", "gateway/runtime/api.py", "gateway/router/answer.py"} <= set(sizes)
    assert {path: n for path, n in sizes.items() if n > MAX_MESSAGE_PATH_LINES} == {}


# Nor does any function there grow past this: split it into named steps with plain data between them
# (#37), not by squeezing lines.  A function's length counts from its ``def`` to its last line.
MAX_MESSAGE_PATH_FUNCTION_LINES = 60


def _function_lengths(path: Path, root: Path = ROOT) -> dict[str, int]:
    """Every function and method in ``path`` (nested ones too): ``"<path>:<line> <name>"`` -> its lines."""
    where = path.relative_to(root).as_posix()
    return {f"{where}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
            for node in _nodes(path)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None}


def test_no_function_on_the_message_path_is_over_60_lines():
    lengths = {name: n for pattern in MESSAGE_PATH for path in ROOT.glob(pattern)
               for name, n in _function_lengths(path).items()}
    names = {name.split(" ", 1)[1] for name in lengths}
    assert {"run", "tool_loop", "parse_chat_request"} <= names  # the scan reads the turn and the local API
    assert {name: n for name, n in lengths.items() if n > MAX_MESSAGE_PATH_FUNCTION_LINES} == {}


def test_a_function_is_measured_from_its_def_to_its_last_line(tmp_path):
    (tmp_path / "m.py").write_text("class C:\n    def f(self):\n        x = 1\n\n        return x\n\n\n"
                                   "async def g(): pass\n")
    assert _function_lengths(tmp_path / "m.py", tmp_path) == {"m.py:2 f": 4, "m.py:8 g": 1}


# Every built-in platform: a package under adapters/ with its config model.
BUILT_IN_PLATFORMS = tuple(sorted(p.parent.name for p in (ROOT / "adapters").glob("*/config.py")))


def _adapter_init(name: str) -> tuple[str, ast.FunctionDef]:
    """The class named by the ``switchboard.adapters`` entry point ``name`` and its ``__init__``, read from source."""
    from importlib.metadata import entry_points

    [ep] = [ep for ep in entry_points(group="switchboard.adapters") if ep.name == name]
    cls = ep.value.partition(":")[2]
    for path in sorted((ROOT / "adapters" / name).glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                [init] = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
                return f"{path.relative_to(ROOT)}:{cls}", init
    raise AssertionError(f"class {cls} of the entry point {name} not found under adapters/{name}/")


def test_each_adapter_takes_its_config_model_not_its_settings_one_by_one():
    """A built-in adapter's constructor takes its ``platforms.<name>`` model first and no keyword named
    like one of the model's settings: it reads them from the model, which checked them once, on load."""
    from gateway.config import platform_models

    models = platform_models()
    wrong = []
    assert len(BUILT_IN_PLATFORMS) >= 10, BUILT_IN_PLATFORMS
    for name in BUILT_IN_PLATFORMS:
        where, init = _adapter_init(name)
        model = models[name]
        params = [a for a in init.args.args[1:] + init.args.kwonlyargs]
        first = init.args.args[1] if len(init.args.args) > 1 else None
        if first is None or first.arg != "config" or ast.unparse(first.annotation or ast.Name("?")) != model.__name__:
            wrong.append(f"{where}.__init__ does not take `config: {model.__name__}` first")
        copied = sorted(a.arg for a in params if a.arg in model.model_fields)
        if copied:
            wrong.append(f"{where}.__init__ takes settings of {model.__name__} one by one: {', '.join(copied)}")
    assert not wrong, "\n".join(wrong)
