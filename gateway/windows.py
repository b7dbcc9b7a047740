"""Context windows a model's server named, kept beside the store for ``switchboard doctor``.

When a server says its window is smaller than the one configured (or assumed), the model client
fits every call to the window it named for the rest of the run (:mod:`gateway.model`).  That
holds only while the daemon runs; the config line that makes it permanent is the operator's to
add.  So the daemon also notes what it learned in ``<home>/learned_windows.json`` (one entry per
model, with when), and ``doctor``, a process of its own, reads it to say which line to add.

    note_learned(home, "default", "llama-3.2-1b", 2048)   # off the event loop (a file write)
    learned_windows(home)   # {"default": {"model": "llama-3.2-1b", "window": 2048, "at": 1764...}}
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from state.atomic import write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "learned_windows.json"


def learned_windows(home: Path) -> dict[str, dict]:
    """What the daemon last noted, per model label; {} when nothing was (or the note is unreadable)."""
    try:
        data = json.loads((Path(home) / FILE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("window"), int)} \
        if isinstance(data, dict) else {}


def note_learned(home: Path, label: str, model: str, window: int) -> None:
    """Add (or replace) ``label``'s entry; a failure to write is logged, never raised (it is only a note)."""
    try:
        notes = learned_windows(home)
        notes[label] = {"model": model, "window": window, "at": time.time()}
        write_atomically(Path(home) / FILE_NAME, json.dumps(notes, indent=2).encode())
    except OSError as exc:
        log.warning("could not note the learned window of %s in %s: %s", label, home, exc)


__all__ = ["FILE_NAME", "learned_windows", "note_learned"]
