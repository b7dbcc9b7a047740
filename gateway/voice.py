"""Voice in and out through the model endpoint's audio API (issue #32 items 3 and 4).

    voice = Voice(VoiceSettings.from_config(cfg))
    transcript = await voice.transcribe(attachment)    # POST /v1/audio/transcriptions (media.transcribe_with)
    audio = await voice.speak("Hello")                 # POST /v1/audio/speech (media.speak_with), OGG/Opus

Both go through the real ``openai`` SDK to ``model.base_url`` with ``model.api_key`` (vLLM, LocalAI
and OpenAI serve this API).  Every failure is a :class:`~gateway.errors.ModelUnavailable` (a 4xx a
:class:`~gateway.errors.ModelRefused`) whose message never quotes the endpoint, which may echo the key.

A voice message is stored when it arrives, its text a placeholder (:func:`pending_line`) that says
what the audio is; the router then calls :func:`transcribe_stored`, which replaces each placeholder by
the transcript, marked ``[voice message, transcribed]`` (what the model sees and the store keeps), or
by a description saying why there is none, with one line for the user.  The audio comes with the
message as received or, when the turn starts from the store (after a restart; clustered, a claimed
session, on any instance), from the media store (``gateway.media.MediaService.audio_of``); its
length is then the one the placeholder states (the platform's, when it gave one).  A placeholder
whose audio is in neither (it could not be kept) gets such a line too, so it is answered.
"""

from __future__ import annotations

import logging
import re
import struct
import time
from dataclasses import dataclass, replace
from typing import Literal

import openai

from gateway.errors import ModelRefused, ModelUnavailable
from gateway.types import Attachment

log = logging.getLogger(__name__)

TRANSCRIBED = "[voice message, transcribed]"
TRANSCRIBING = "transcribing…"  # the status line a streamed reply shows meanwhile (the answer replaces it)
SPEECH_FORMAT: Literal["opus"] = "opus"  # OGG/Opus: what Telegram's sendVoice plays as a voice note, and Discord and Slack play
SPEECH_MIME = "audio/ogg"
MAX_SPEECH_CHARS = 4096  # OpenAI's limit on one speech request's input

_PENDING = re.compile(r"^\[voice message (?P<desc>[^\]\n]*): waiting for its transcript\]$", re.MULTILINE)
_STATED = re.compile(r", (?:(?P<min>\d+) min)? ?(?:(?P<s>\d+) s)?$")  # the length :func:`describe` ends with


@dataclass(frozen=True, slots=True)
class VoiceSettings:
    base_url: str
    api_key: str
    transcribe_with: str | None = None
    speak_with: str | None = None
    voice: str = "alloy"
    max_audio_seconds: float = 300.0
    timeout_seconds: float = 60.0

    @classmethod
    def from_config(cls, cfg) -> "VoiceSettings":
        m = cfg.media
        return cls(base_url=str(cfg.model.base_url), api_key=cfg.model.api_key, transcribe_with=m.transcribe_with,
                   speak_with=m.speak_with, voice=m.voice, max_audio_seconds=m.max_audio_seconds,
                   timeout_seconds=m.audio_timeout_seconds)


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    seconds: float | None  # the audio's length when known
    took: float  # seconds the endpoint took


class Voice:
    """The audio API client: transcription (voice in) and speech (voice out)."""

    def __init__(self, settings: VoiceSettings):
        self.settings = settings
        self._client = openai.AsyncOpenAI(base_url=settings.base_url, api_key=settings.api_key or "not-needed",
                                          timeout=settings.timeout_seconds, max_retries=1)

    @property
    def hears(self) -> bool:
        """Whether voice messages are transcribed (``media.transcribe_with`` is set)."""
        return bool(self.settings.transcribe_with)

    @property
    def speaks(self) -> bool:
        """Whether replies can be spoken (``media.speak_with`` is set)."""
        return bool(self.settings.speak_with)

    async def close(self) -> None:
        await self._client.close()

    async def transcribe(self, audio: Attachment) -> Transcript:
        """The words in ``audio`` (its ``data``); raises ModelUnavailable when the endpoint fails or refuses."""
        if not self.settings.transcribe_with:
            raise ModelUnavailable("no transcription model is configured (media.transcribe_with)")
        if not audio.data:
            raise ModelUnavailable("the audio was not downloaded")
        started = time.monotonic()
        result = await self._call("transcription", self._client.audio.transcriptions.create(
            model=self.settings.transcribe_with,
            file=(audio.name or "audio", audio.data, audio.mime_type or "application/octet-stream")))
        return Transcript((getattr(result, "text", None) or "").strip(), audio_seconds(audio),
                          time.monotonic() - started)

    async def speak(self, text: str) -> bytes:
        """``text`` spoken (OGG/Opus bytes); raises ModelUnavailable when the endpoint fails or refuses."""
        if not self.settings.speak_with:
            raise ModelUnavailable("no speech model is configured (media.speak_with)")
        response = await self._call("speech", self._client.audio.speech.create(
            model=self.settings.speak_with, voice=self.settings.voice, input=spoken_text(text),
            response_format=SPEECH_FORMAT))
        data = response.content
        if not data:
            raise ModelUnavailable("the speech endpoint answered with no audio")
        return data

    async def _call(self, what: str, call):
        try:
            return await call
        except openai.APIStatusError as exc:
            log.warning("the %s endpoint answered %s", what, exc.status_code)
            if 400 <= exc.status_code < 500 and exc.status_code not in (408, 429):
                raise ModelRefused(exc.status_code, f"the {what} endpoint refused it ({exc.status_code})") from None
            raise ModelUnavailable(f"the {what} endpoint failed ({exc.status_code})") from None
        except openai.APITimeoutError:
            raise ModelUnavailable(f"the {what} endpoint did not answer in time", "timeout") from None
        except openai.APIConnectionError:
            raise ModelUnavailable(f"the {what} endpoint could not be reached", "unreachable") from None
        except openai.OpenAIError as exc:  # an answer the SDK could not read
            log.warning("the %s endpoint's answer was unusable: %s", what, type(exc).__name__)
            raise ModelUnavailable(f"the {what} endpoint's answer was unusable") from None


def spoken_text(text: str) -> str:
    """A reply as read aloud: Markdown marks, links' targets and code fences left out, within the limit."""
    text = re.sub(r"```[^\n]*\n?", "", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"[*_`#>]+", "", text)
    text = re.sub(r"[ \t]+", " ", text).strip()
    return text[:MAX_SPEECH_CHARS] or "(no text)"


# -- the stored text of a voice message ---------------------------------------------------------------

def describe(audio: Attachment) -> str:
    """``voice.ogg, audio/ogg, 12 KB, 4 s``: what the audio is, for its placeholder and its description."""
    name = re.sub(r"[\]\n]", " ", audio.name or "audio")
    parts = [name]
    if audio.mime_type:
        parts.append(audio.mime_type)
    size = audio.size if audio.size is not None else (len(audio.data) if audio.data else None)
    if size is not None:
        parts.append(f"{max(1, round(size / 1024))} KB")
    seconds = audio_seconds(audio)
    if seconds is not None:
        parts.append(_length(seconds))
    return ", ".join(parts)


def pending_line(audio: Attachment) -> str:
    """The stored text of a voice message until its transcript is known."""
    return f"[voice message {describe(audio)}: waiting for its transcript]"


def is_pending(text: str | None) -> bool:
    return bool(text) and _PENDING.search(text or "") is not None


@dataclass(frozen=True, slots=True)
class Transcribed:
    """What :func:`transcribe_stored` made of one stored message."""

    text: str  # the message's new stored text
    problems: tuple[str, ...] = ()  # one line per voice message that has no transcript, for the user
    transcribed: int = 0  # how many got one
    took: float = 0.0  # seconds the endpoint took, summed
    answerable: bool = True  # False: nothing but voice messages without a transcript (the line is the answer)


async def transcribe_stored(voice: Voice, stored: str, audio: tuple[Attachment, ...]) -> Transcribed:
    """``stored`` (a message's text) with each placeholder replaced, in order, by the transcript of the
    matching attachment of ``audio``; a placeholder without its audio says it was not kept."""
    problems: list[str] = []
    count = 0
    took = 0.0
    pieces: list[str] = []
    end = 0
    for index, match in enumerate(_PENDING.finditer(stored)):
        pieces.append(stored[end:match.start()])
        end = match.end()
        desc = match.group("desc")
        clip = audio[index] if index < len(audio) else None
        if clip is None or not clip.data:
            pieces.append(f"[voice message {desc}: not transcribed, its audio was not kept]")
            problems.append("I lost the audio of your voice message before I could transcribe it. Please send it again.")
            continue
        if clip.duration is None:  # read back from the media store: the length the placeholder states comes first
            clip = replace(clip, duration=stated_seconds(desc))
        seconds = audio_seconds(clip)
        limit = voice.settings.max_audio_seconds
        if seconds is not None and seconds > limit:
            pieces.append(f"[voice message {desc}: not transcribed, longer than the {_length(limit)} limit]")
            problems.append(f"Your voice message is {_length(seconds)} long; I transcribe up to {_length(limit)}. "
                            "Please send a shorter one, or type it.")
            continue
        try:
            transcript = await voice.transcribe(clip)
        except ModelUnavailable as exc:
            log.warning("a voice message was not transcribed: %s", exc)
            pieces.append(f"[voice message {desc}: could not be transcribed]")
            problems.append(f"I could not transcribe your voice message ({exc}). It is saved; "
                            "please send it again, or type it.")
            continue
        took += transcript.took
        if not transcript.text:
            pieces.append(f"[voice message {desc}: no words could be made out]")
            problems.append("I could not make out any words in your voice message. Please send it again, or type it.")
            continue
        count += 1
        pieces.append(f"{TRANSCRIBED}\n{transcript.text}")
    rest = _PENDING.sub("", stored).strip()  # the caption, other attachments
    pieces.append(stored[end:])
    return Transcribed("".join(pieces), tuple(problems), count, took, answerable=bool(count or rest))


def stated_seconds(desc: str) -> float | None:
    """The length a :func:`describe` text ends with (``…, 4 s``, ``…, 5 min 3 s``); None: it states none."""
    match = _STATED.search(desc)
    if match is None or not (match.group("min") or match.group("s")):
        return None
    return 60.0 * int(match.group("min") or 0) + int(match.group("s") or 0)


def _length(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


# -- how long a clip is ---------------------------------------------------------------------------------

def audio_seconds(audio: Attachment) -> float | None:
    """The clip's length: the platform's own figure, else read from a WAV or OGG header; None: unknown."""
    if audio.duration is not None:
        return float(audio.duration)
    data = audio.data
    if not data:
        return None
    try:
        if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
            return _wav_seconds(data)
        if data[:4] == b"OggS":
            return _ogg_seconds(data)
    except (struct.error, IndexError, ZeroDivisionError):
        return None
    return None


def _wav_seconds(data: bytes) -> float | None:
    at, byte_rate = 12, 0
    while at + 8 <= len(data):
        chunk, size = data[at:at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt ":
            byte_rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            return size / byte_rate if byte_rate else None
        at += 8 + size + (size & 1)
    return None


def _ogg_seconds(data: bytes) -> float | None:
    """The last page's granule position over the stream's rate (48 kHz for Opus, less its pre-skip)."""
    segments = data[26]
    packet = data[27 + segments:27 + segments + 32]
    if packet.startswith(b"OpusHead"):
        rate, skip = 48000, struct.unpack_from("<H", packet, 10)[0]
    elif packet.startswith(b"\x01vorbis"):
        rate, skip = struct.unpack_from("<I", packet, 12)[0], 0
    else:
        return None
    last = data.rfind(b"OggS")
    granule = struct.unpack_from("<q", data, last + 6)[0]
    if last == 0 or granule <= 0 or not rate:  # no audio page (a cut-off file): not known
        return None
    return max(0, granule - skip) / rate
