"""Dependencies point one way: adapters -> gateway -> state, compression."""

import ast
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
BESIDE_THE_MESSAGE_PATH = ("gateway.runtime", "gateway.cron", "gateway.memory", "gateway.cli")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, with ``from a import b`` counted as both ``a`` and ``a.b``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
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


def test_cron_and_memory_never_import_the_runtime_or_the_cli():
    offenders = []
    for package in ("cron", "memory"):
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
