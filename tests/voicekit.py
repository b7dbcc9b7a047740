"""Audio for the voice tests and the voice benchmark: small OGG/Opus and WAV files whose headers say
how long they are (the payload is silence or filler: the fake transcription server does not decode it)."""

from __future__ import annotations

import struct

OPUS_PRE_SKIP = 312


def _ogg_page(granule: int, sequence: int, packet: bytes, header_type: int = 0) -> bytes:
    segments = bytes([255] * (len(packet) // 255) + [len(packet) % 255])
    return (b"OggS" + bytes([0, header_type]) + struct.pack("<qIII", granule, 0x5157, sequence, 0)
            + bytes([len(segments)]) + segments + packet)


def ogg_opus(seconds: float, *, filler: int = 2000) -> bytes:
    """An OGG/Opus stream (as Telegram voice notes are) lasting ``seconds`` by its last granule position."""
    head = b"OpusHead" + bytes([1, 1]) + struct.pack("<HIhB", OPUS_PRE_SKIP, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 4) + b"test" + struct.pack("<I", 0)
    body = b"\xfc" * filler
    return (_ogg_page(0, 0, head, 2) + _ogg_page(0, 1, tags)
            + _ogg_page(int(seconds * 48000) + OPUS_PRE_SKIP, 2, body, 4))


def wav(seconds: float, *, rate: int = 8000) -> bytes:
    """A 16-bit mono PCM WAV file of ``seconds`` of silence."""
    data = b"\x00\x00" * int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)
