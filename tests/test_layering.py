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
                           "gateway.formatting", "gateway.logging_setup", "gateway.tasks"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


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
            if name.split(".")[0] == "gateway" and name not in ADAPTER_ALLOWED_GATEWAY:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_no_adapter_writes_sql():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "adapters").rglob("*.py")
        if "sqlite3" in _imports(path) or "state" in {n.split(".")[0] for n in _imports(path)}
    ]
    assert offenders == []
