"""The media folder: attachments as files, content-addressed by SHA-256, outside the database.

    <root>/ab/cdef...     the bytes of the file whose SHA-256 is abcdef...

A picture, a voice note or a document is written here once, however many messages refer to it;
``state.db`` keeps only its hash, name, type and size (``state._media``), so the database stays
small whatever people send (base64 in the store is how other agents' databases grew to gigabytes).
Files are mode 0600 and folders 0700: only the gateway's user reads them.  A file is written to a
temporary name and renamed into place, so a crash never leaves half a file under a hash.

Nothing here knows about messages: :meth:`MediaFiles.sweep` is given the hashes still referenced
and deletes the others (older than a grace period, so a file saved just before its message is
stored is never taken).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .atomic import write_atomically
from .errors import StateError

_HASH = re.compile(r"^[0-9a-f]{64}$")
TEMP_PREFIX = ".tmp-"  # a write in progress; one a crash cut short is swept

#: a file younger than this is kept by a sweep even when nothing refers to it yet (its message is
#: being stored)
SWEEP_GRACE_SECONDS = 3600.0


class BadHash(StateError, ValueError):
    """Not a SHA-256 in hex: the media store is asked only for the hashes it handed out."""


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Swept:
    """What a sweep deleted: how many files and bytes."""

    files: int = 0
    bytes: int = 0


class MediaFiles:
    """The media folder at ``root`` (created on first write, mode 0700)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"MediaFiles({str(self.root)!r})"

    def path(self, sha256: str) -> Path:
        if not _HASH.match(sha256):
            raise BadHash(f"{sha256!r} is not a SHA-256 in hex")
        return self.root / sha256[:2] / sha256[2:]

    def put(self, data: bytes) -> str:
        """Keep ``data``; returns its SHA-256.  Writing the same bytes again is a no-op."""
        sha = sha256_of(data)
        target = self.path(sha)
        if target.exists():
            os.utime(target)  # fresh again: a sweep running now gives it the grace period
            return sha
        _make_dir(self.root)
        _make_dir(target.parent)
        write_atomically(target, data, temp_prefix=TEMP_PREFIX)
        return sha

    def read(self, sha256: str) -> bytes | None:
        """The bytes under ``sha256``, or None when they are gone (deleted with their session)."""
        try:
            return self.path(sha256).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def hashes(self) -> Iterator[str]:
        """Every hash the folder holds."""
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    name = sub.name + f.name
                    if _HASH.match(name):
                        yield name

    def usage(self) -> tuple[int, int]:
        """(files, bytes) in the folder."""
        files = size = 0
        for sha in self.hashes():
            try:
                size += self.path(sha).stat().st_size
                files += 1
            except FileNotFoundError:
                continue
        return files, size

    def copy_to(self, target: Path | str) -> tuple[int, int]:
        """Copy every file ``target`` (another media folder) does not hold yet; returns (files, bytes)
        copied.  Content-addressed: a second backup into the same folder copies only what is new."""
        other = MediaFiles(target)
        files = size = 0
        for sha in self.hashes():
            if other.exists(sha):
                continue
            data = self.read(sha)
            if data is None:  # deleted meanwhile
                continue
            other.put(data)
            files += 1
            size += len(data)
        return files, size

    def sweep(self, referenced: Iterable[str], *, doomed: Iterable[str] = (), now: float | None = None,
              grace_seconds: float = SWEEP_GRACE_SECONDS) -> Swept:
        """Delete every file whose hash is not in ``referenced`` and is older than ``grace_seconds``;
        those in ``doomed`` (the files of sessions just deleted) whatever their age."""
        keep = set(referenced)
        now_doomed = set(doomed) - keep
        cutoff = (time.time() if now is None else now) - grace_seconds
        files = size = 0
        for sha in list(self.hashes()):
            if sha in keep:
                continue
            target = self.path(sha)
            try:
                stat = target.stat()
                if stat.st_mtime > cutoff and sha not in now_doomed:
                    continue
                target.unlink()
            except FileNotFoundError:
                continue
            files += 1
            size += stat.st_size
        for sub in self.root.iterdir() if self.root.is_dir() else ():
            if sub.is_dir() and len(sub.name) == 2:
                for tmp in sub.glob(f"{TEMP_PREFIX}*"):  # a write a crash cut short
                    if tmp.stat().st_mtime <= cutoff:
                        tmp.unlink(missing_ok=True)
                try:
                    sub.rmdir()  # only when empty
                except OSError:
                    pass
        return Swept(files, size)


def _make_dir(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)


__all__ = ["BadHash", "MediaFiles", "SWEEP_GRACE_SECONDS", "Swept", "sha256_of"]
