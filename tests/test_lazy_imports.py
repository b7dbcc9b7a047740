"""The daemon and the CLI start without loading the heavy optional libraries they do not use yet.

The mcp SDK alone costs over a second of CPU to import; a daemon with no ``tools.mcp_servers`` (and
``switchboard --help``) must never pay it.  Each check runs in a fresh interpreter, as a user's start does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Top-level packages that are imported only where they are used (an MCP server connects, the dashboard's
# templates are loaded, a fact is encoded or ranked on a worker thread).
LAZY = ("mcp", "mcp_types", "jinja2", "numpy")


def _loaded(code: str) -> set[str]:
    """The LAZY packages loaded once ``code`` has run in a new interpreter."""
    probe = (f"{code}\nimport sys\n"
             f"print('loaded:' + ','.join(sorted({{name.split('.')[0] for name in sys.modules}} & {set(LAZY)!r})))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("loaded:"), done.stdout
    return {name for name in last.removeprefix("loaded:").split(",") if name}


def test_importing_the_daemon_loads_no_mcp_sdk_jinja2_or_numpy() -> None:
    assert _loaded("import gateway.runtime.daemon") == set()


def test_building_a_daemon_with_no_mcp_server_loads_no_mcp_sdk(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  base_url: http://127.0.0.1:9/v1\n  api_key: sk-test\n  name: m\n")
    code = ("from gateway.config import load_config\n"
            "from gateway.tools import ToolRegistry\n"
            "from gateway.tools_mcp import McpTools\n"
            f"cfg = load_config({str(config)!r})\n"
            "tools = McpTools(cfg.tools, ToolRegistry())\n"
            "tools.start()\n"
            "assert tools.catalog() == []")
    assert _loaded(code) == set()


def test_switchboard_help_loads_no_mcp_sdk() -> None:
    code = ("from click.testing import CliRunner\n"
            "from gateway.cli.main import main\n"
            "result = CliRunner().invoke(main, ['--help'])\n"
            "assert result.exit_code == 0 and 'Usage' in result.output, result.output\n"
            "result = CliRunner().invoke(main, ['tools', '--help'])\n"
            "assert result.exit_code == 0 and 'Usage' in result.output, result.output")
    assert _loaded(code) == set()



def test_the_fact_dimension_named_without_numpy_is_hrrs() -> None:
    from gateway.memory.facts import hrr, scoring
    from gateway.memory.facts.service import FactSettings

    assert scoring.DEFAULT_DIM == hrr.DEFAULT_DIM == FactSettings().dimension
