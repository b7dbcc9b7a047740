"""Sample files the fake platforms serve: a real picture, a real PDF with text, and bad ones.

Built here byte by byte (no file is checked in, nothing is downloaded): a PNG any decoder opens,
a one-page PDF whose text pypdf extracts, a PDF that does not parse, a ZIP archive posing as a
PDF whose content inflates a thousandfold (a zip bomb in miniature), an Ogg voice note header,
and broken pictures: a PNG cut in half, a JPEG whose scan is damaged, a PNG bomb.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


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


def truncated_png() -> bytes:
    """A real 64 x 64 PNG cut in half: the signature and header intact, the image data cut, no IEND."""
    row = b"\x00" + bytes(range(192))
    whole = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
             + _chunk(b"IDAT", zlib.compress(row * 64, 0)) + _chunk(b"IEND", b""))
    return whole[:len(whole) // 2]


def corrupt_jpeg() -> bytes:
    """A baseline JPEG (written by Pillow) whose entropy-coded scan is overwritten with noise past its start:
    the markers and tables are intact, the scan cannot be decoded."""
    import random

    from PIL import Image

    out = io.BytesIO()
    Image.effect_noise((128, 128), 60).convert("RGB").save(out, "JPEG", quality=90)
    data = bytearray(out.getvalue())
    scan = data.find(b"\xff\xda")
    rng = random.Random(36)
    for i in range(scan + 200, min(scan + 2200, len(data) - 2)):
        data[i] = rng.randrange(256)
    return bytes(data)


def cmyk_jpeg() -> bytes:
    """A whole, valid CMYK JPEG (as print workflows export): Pillow reads it; some vision endpoints refuse it."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("CMYK", (16, 16), (0, 128, 255, 0)).save(out, "JPEG")
    return out.getvalue()


def png_bomb(side: int = 50_000) -> bytes:
    """A valid ``side`` x ``side`` one-bit greyscale PNG of zeros: a few hundred kilobytes on disk, 2.5 billion
    pixels (10 GB as RGBA) once decoded."""
    row = b"\x00" * (1 + (side + 7) // 8)
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row * 1000) for _ in range(side // 1000)) + packer.compress(row * (side % 1000))
    idat += packer.flush()
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
            + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))


def ogg_voice() -> bytes:
    """The first page header of an Ogg Opus voice note (what Telegram sends as a voice message)."""
    return b"OggS\x00\x02" + b"\x00" * 20 + b"\x01\x13OpusHead\x01\x01" + b"\x00" * 16


__all__ = ["broken_pdf", "cmyk_jpeg", "corrupt_jpeg", "ogg_voice", "pdf", "png", "png_bomb", "truncated_png", "zip_bomb"]
