"""The MCP server on the legacy revision (tests/mcp_servers/legacy_server.py) and the environment that
runs it: ``.venv-mcp1`` at the checkout's root, with the SDK 1.x (``make mcp-legacy`` makes it; ``make
test`` does so first).  Without it the tests that need it say they skipped and how to get it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-mcp1" / "bin" / "python"
SERVER = str(ROOT / "tests" / "mcp_servers" / "legacy_server.py")

needs_legacy = pytest.mark.skipif(not PYTHON.exists(), reason=f"no SDK 1.x environment at {PYTHON.parent.parent} "
                                  "(run `make mcp-legacy`, which `make test` runs)")


def legacy_server(**overrides) -> dict:
    """The config of the legacy server (``tools.mcp_servers.<name>``), every tool allowed."""
    return {"command": str(PYTHON), "args": [SERVER], "env": {"PYTHONCOERCECLOCALE": "0"},
            "allow": ["legacy__*"], **overrides}
