"""Sample files the fake platforms serve: a real picture, a real PDF with text, and bad ones.

Built here byte by byte (no file is checked in, nothing is downloaded): a PNG any decoder opens,
a one-page PDF whose text pypdf extracts, a PDF that does not parse, a ZIP archive posing as a
PDF whose content inflates a thousandfold (a zip bomb in miniature), an Ogg voice note header.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib


def png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid RGB PNG of one colour."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height)) + chunk(b"IEND", b""))


def pdf(text: str) -> bytes:
    """A one-page PDF showing ``text`` (ASCII, no parentheses) in Helvetica."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def broken_pdf() -> bytes:
    """Starts like a PDF, then nothing a parser can use."""
    return b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R\n" + b"\xde\xad\xbe\xef" * 64


def zip_bomb(inflated_bytes: int = 5_000_000) -> bytes:
    """A ZIP archive whose one member inflates to ``inflated_bytes`` of zeros (about a thousandfold)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("report.txt", b"\x00" * inflated_bytes)
    return out.getvalue()


def ogg_voice() -> bytes:
    """The first page header of an Ogg Opus voice note (what Telegram sends as a voice message)."""
    return b"OggS\x00\x02" + b"\x00" * 20 + b"\x01\x13OpusHead\x01\x01" + b"\x00" * 16


__all__ = ["broken_pdf", "ogg_voice", "pdf", "png", "zip_bomb"]
