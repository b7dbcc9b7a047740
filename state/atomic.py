"""Writing a file so that a crash leaves the old contents or the new, never half of either.

One helper for every file the gateway keeps beside its database (media files, memory files):
the bytes go to a temporary file in the same folder, are flushed to disk, made readable by
their owner only, and renamed over the target in one step.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600, sync_folder: bool = False,
                     temp_prefix: str | None = None) -> None:
    """``path`` holds ``data`` (mode ``mode``), or, after a failure or a crash, what it held before.

    ``sync_folder``: also flush the folder, so that the rename itself survives a crash.
    ``temp_prefix``: how the temporary file's name starts, for a folder whose owner sweeps the ones
    a crash left behind (default ``.<name>.``, ending ``.tmp``)."""
    prefix, suffix = (temp_prefix, "") if temp_prefix is not None else (f".{path.name}.", ".tmp")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_folder:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


__all__ = ["write_atomically"]
