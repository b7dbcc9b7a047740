"""The type checker `make check` runs catches a call to a method a service does not have.

`make check` (run by `make test` before pytest) proves the real tree is clean; these tests prove
that the project's mypy settings would fail it on the kind of slip that once reached a release:
calling a method that no service defines.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    # The project's own settings (pyproject.toml), on one file instead of the tree, with a cache of
    # its own (the shared one remembers a module named `snippet` at another test's path); errors in
    # the modules it imports are `make check`'s to report, not this snippet's.
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(tmp_path / "mypy_cache"), "--follow-imports=silent", str(snippet)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


# mypy checks the snippet and every module it imports from a fresh cache: about 30 s alone, several
# minutes on two cores shared with the other test workers, more than the suite's 120 s default.
@pytest.mark.timeout(400)
def test_a_call_to_a_method_the_service_does_not_have_is_an_error_and_only_that(tmp_path):
    done = mypy(tmp_path, (
        "from gateway.cron.service import CronService\n"
        "\n"
        "async def reload_everything(cron: CronService) -> None:\n"
        "    await cron.no_such_method()\n"
        "\n"
        "async def reload_untyped(cron):\n"  # check_untyped_defs: bodies without annotations count too
        "    service: CronService = cron\n"
        "    await service.no_such_method()\n"
        "\n"
        "async def stop(cron: CronService) -> None:\n"
        "    await cron.stop()\n"
    ))
    errors = [line.removeprefix(f"{tmp_path}/") for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [
        'snippet.py:4: error: "CronService" has no attribute "no_such_method"  [attr-defined]',
        'snippet.py:8: error: "CronService" has no attribute "no_such_method"  [attr-defined]',
    ], done.stdout + done.stderr
    assert done.returncode == 1
