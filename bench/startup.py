"""Cold start: what the daemon costs before its local API listens.

  (a) ``import gateway.runtime.daemon`` in a fresh interpreter: CPU seconds (user + system) and wall time.
  (b) ``switchboard run`` with a minimal config (a fake model on 127.0.0.1, no platform, no MCP server),
      from the process's start to its READY=1 on NOTIFY_SOCKET: the process's CPU seconds by then
      (from /proc) and the wall time.

Each is the median of --runs fresh processes (5 by default).  The machine is shared: read the figures
beside each other, from the same run, not against a number from another day.

    .venv/bin/python bench/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SWITCHBOARD = str(Path(sys.executable).with_name("switchboard"))
TICK = os.sysconf("SC_CLK_TCK")
READY_SECONDS = 120.0


def _import_once() -> tuple[float, float]:
    """(CPU, wall) seconds of one ``import gateway.runtime.daemon`` in a new interpreter (its start included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import gateway.runtime.daemon"], cwd=ROOT, check=True, timeout=120)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _start_once(workdir: Path, model_port: int, run: int) -> tuple[float, float]:
    """(CPU, wall) seconds of one ``switchboard run`` from its start to READY=1."""
    home = workdir / f"home-{run}"
    config = workdir / f"config-{run}.yaml"
    config.write_text(yaml.safe_dump({
        "home": str(home), "api": {"port": 0},
        "model": {"base_url": f"http://127.0.0.1:{model_port}/v1", "name": "fake", "api_key": "x"},
    }))
    path = workdir / f"notify-{run}.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env["NOTIFY_SOCKET"] = str(path)
    env["PYTHONPATH"] = str(ROOT)  # this checkout's gateway, whichever one the venv's switchboard was installed from
    start = time.monotonic()
    proc = subprocess.Popen([SWITCHBOARD, "run", "--config", str(config)], env=env, cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = start + READY_SECONDS
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise SystemExit(f"the daemon sent no READY=1 within {READY_SECONDS:g}s (exit {proc.poll()})")
            notify.settimeout(left)
            try:
                data = notify.recv(4096).decode()
            except TimeoutError:
                continue
            if "READY=1" in data.split("\n"):
                wall = time.monotonic() - start
                return _cpu_of(proc.pid), wall
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        notify.close()


def _median(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    imports = [_import_once() for _ in range(args.runs)]
    cpu, wall = _median(imports)
    print(f"(a) import gateway.runtime.daemon: {cpu:.2f} s CPU, {wall:.2f} s wall (median of {args.runs})")
    model = subprocess.Popen([sys.executable, "-m", "tests.fakes.model_server", "--delay", "0"], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert model.stdout is not None
        port = int(model.stdout.readline().split()[1])
        with tempfile.TemporaryDirectory(prefix="sb-startup-") as tmp:
            starts = [_start_once(Path(tmp), port, run) for run in range(args.runs)]
    finally:
        model.terminate()
        model.wait(30)
    cpu, wall = _median(starts)
    print(f"(b) switchboard run to READY=1:    {cpu:.2f} s CPU, {wall:.2f} s wall (median of {args.runs})")


if __name__ == "__main__":
    main()
