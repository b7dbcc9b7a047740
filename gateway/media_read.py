"""What a file really is, and the text a model can read from it.

Everything here is pure and synchronous (the media service runs it on a worker thread): given
the bytes an adapter downloaded and what the platform claimed they were, it answers with the
real type, the text (a document's, up to ``max_chars``) and, when the file cannot be used, one
line that says why.  Nothing here raises on any input: a file that lies about its type, a ZIP
archive posing as a document (a zip bomb is never opened), a PDF that will not parse, audio in
a codec nobody knows, all become a :class:`Reading` with a ``note``.

A picture is decoded far enough to know it is whole (Pillow's ``verify()``, then its first frame
loaded), after its size in pixels is read from its header and checked against
:data:`MAX_IMAGE_PIXELS`: a truncated PNG, a JPEG with a damaged scan or a decompression bomb is
never sent to a model, which would refuse it (and every later turn that sent it again).
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from struct import error as struct_error

from PIL import Image

log = logging.getLogger(__name__)

#: pictures a vision model reads, by their first bytes
_IMAGE_MAGIC = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
#: audio containers a transcription endpoint takes, by their first bytes
_AUDIO_MAGIC = (
    (b"OggS", "audio/ogg"),
    (b"ID3", "audio/mpeg"),
    (b"fLaC", "audio/flac"),
    (b"\x1aE\xdf\xa3", "audio/webm"),
    (b"#!AMR", "audio/amr"),
)
#: archives and executables: never read as a document, whatever they claim (a zip bomb is one)
_ARCHIVE_MAGIC = (
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"\x7fELF", "a program"),
    (b"MZ", "a program"),
)
_TEXT_TYPES = {"text/plain", "text/markdown", "text/x-markdown", "text/csv", "application/json", "text/json",
               "application/csv", "text/tab-separated-values", "application/x-ndjson"}
_TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".csv", ".tsv", ".json", ".jsonl", ".log")
#: a PDF is read page by page, no further than this (a document of more pages is cut)
MAX_PDF_PAGES = 500
#: a picture of more pixels than this is not decoded (a decompression bomb: a few kilobytes on disk,
#: gigabytes in memory); 40 megapixels is more than any phone camera takes
MAX_IMAGE_PIXELS = 40_000_000


@dataclass(frozen=True, slots=True)
class Reading:
    """What a file turned out to be: its kind (``image``, ``audio``, ``document``), its real type,
    the text read from it (None: nothing to read), and a note when it could not be used."""

    kind: str
    mime: str | None
    text: str | None = None
    note: str | None = None
    pages: int | None = None


def sniff_image(data: bytes) -> str | None:
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def sniff_audio(data: bytes) -> str | None:
    for magic, mime in _AUDIO_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data[4:8] == b"ftyp":
        return "audio/mp4"
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:  # an MPEG frame without a tag
        return "audio/mpeg"
    return None


def _archive(data: bytes) -> str | None:
    return next((what for magic, what in _ARCHIVE_MAGIC if data.startswith(magic)), None)


def read_file(kind: str, name: str, mime: str | None, data: bytes, *, max_chars: int) -> Reading:
    """What ``data`` (claimed by the platform to be a ``kind`` of type ``mime``) really is."""
    try:
        return _read(kind, name, (mime or "").split(";")[0].strip().lower() or None, data, max_chars)
    except Exception as exc:  # noqa: BLE001 - a file never fails the message it came with
        log.warning("could not read attachment %r: %s", name, type(exc).__name__)
        return Reading(kind, mime, note=f"could not be read ({type(exc).__name__})")


def _read(kind: str, name: str, mime: str | None, data: bytes, max_chars: int) -> Reading:
    if not data:
        return Reading(kind, mime, note="is empty")
    if kind == "image":
        real = sniff_image(data)
        if real is None:
            what = _archive(data)
            return Reading("image", mime, note=f"is not a picture ({what or 'its bytes are not JPEG, PNG, GIF or WebP'}), "
                                              "so the model cannot see it")
        return Reading("image", real, note=_damaged(data))
    if kind == "audio":
        real = sniff_audio(data)
        if real is None:
            return Reading("audio", mime, note="is audio in a format I do not recognise, so it cannot be transcribed")
        return Reading("audio", real)
    return _document(name, mime, data, max_chars)


def _damaged(data: bytes) -> str | None:
    """Why a picture cannot be shown (too many pixels, damaged, cut short), or None when it is whole."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                return _too_large(width, height)
            image.verify()  # the structure: every chunk there, checksums right (PNG), up to its end
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # the pixels of the first frame: a damaged scan or a cut-off file fails here
    except Image.DecompressionBombError:  # Pillow's own cap (beyond ours) refused it at the header
        return f"is a picture of more than {MAX_IMAGE_PIXELS:,} pixels, too large to read, so the model cannot see it"
    except (OSError, SyntaxError, ValueError, IndexError, struct_error, EOFError, MemoryError) as exc:
        log.info("a picture did not decode: %s: %s", type(exc).__name__, exc)
        cut = "truncated" in str(exc).lower()
        return (f"is a damaged picture ({'cut off before its end' if cut else 'its data does not decode'}), "
                "so the model cannot see it")
    return None


def _too_large(width: int, height: int) -> str:
    return (f"is a picture of {width:,} x {height:,} pixels, more than the {MAX_IMAGE_PIXELS:,} read, "
            "so the model cannot see it")


def _document(name: str, mime: str | None, data: bytes, max_chars: int) -> Reading:
    lower = name.lower()
    claims_pdf = mime == "application/pdf" or lower.endswith(".pdf")
    claims_text = (mime in _TEXT_TYPES or (mime or "").startswith("text/") or lower.endswith(_TEXT_SUFFIXES))
    archive = _archive(data)
    if archive is not None:
        if claims_pdf or claims_text:
            return Reading("document", mime, note=f"says it is {'a PDF' if claims_pdf else 'text'} but is {archive}; "
                                                  "it was not opened")
        return Reading("document", mime)  # a .docx, a .zip: described, never unpacked
    if data.startswith(b"%PDF-"):
        return _pdf(data, max_chars)
    if claims_pdf:
        return Reading("document", mime, note="says it is a PDF but is not one; it was not read")
    if sniff_image(data) is not None and (claims_text or claims_pdf):
        return Reading("document", mime, note="says it is a document but is a picture; it was not read")
    if claims_text:
        return _text(mime, lower, data, max_chars)
    return Reading("document", mime)  # another kind of file: described by name, type and size


def _text(mime: str | None, lower: str, data: bytes, max_chars: int) -> Reading:
    if b"\x00" in data[:8192]:
        return Reading("document", mime, note="says it is text but holds binary data; it was not read")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # every byte is a character: old spreadsheets' CSV exports
    if (mime in ("application/json", "text/json") or lower.endswith(".json")) and len(data) < 1_000_000:
        try:
            json.loads(text)
        except ValueError:
            return Reading("document", mime, text=_cut(text, max_chars),
                           note="says it is JSON but does not parse; it is read as plain text")
    return Reading("document", mime or "text/plain", text=_cut(text, max_chars))


def _pdf(data: bytes, max_chars: int) -> Reading:
    import io

    try:
        import pypdf
        from pypdf.errors import PyPdfError
    except ImportError:  # pragma: no cover - a dependency of the package
        return Reading("document", "application/pdf", note="could not be read (pypdf is not installed)")
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return Reading("document", "application/pdf", note="is a password-protected PDF; it was not read")
        pages = len(reader.pages)
        chunks: list[str] = []
        size = 0
        for page in reader.pages[:MAX_PDF_PAGES]:
            chunk = page.extract_text() or ""
            chunks.append(chunk)
            size += len(chunk)
            if size > max_chars:
                break
    except (PyPdfError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError, OSError) as exc:
        log.info("a PDF did not parse: %s", type(exc).__name__)
        return Reading("document", "application/pdf", note="is a PDF that does not parse; it was not read")
    text = "\n\n".join(c.strip() for c in chunks if c.strip())
    if not text:
        return Reading("document", "application/pdf", pages=pages,
                       note="is a PDF without text (scanned pages?); only its name reaches the model")
    return Reading("document", "application/pdf", text=_cut(text, max_chars), pages=pages)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... cut here: {len(text) - max_chars:,} more characters not read ...]"


__all__ = ["MAX_IMAGE_PIXELS", "MAX_PDF_PAGES", "Reading", "read_file", "sniff_audio", "sniff_image"]
