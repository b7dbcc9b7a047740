"""One look at a model server: does ``GET {base_url}/models`` answer, which models it serves, and
what to do when it does not.

Used by the daemon at start (a WARNING naming the URL; ``/healthz`` says so at once), by
``switchboard doctor`` (a ✗ with the likely fix) and by ``switchboard setup`` (which adds the missing
``/v1`` itself and offers the served names)::

    probe = await probe_models(http, "http://127.0.0.1:11434", api_key="")
    probe.problem("llama3.1:8b")   # None, or what is wrong, in words
    probe.fix("llama3.1:8b", "model")  # what to set: model.base_url ending in /v1, model.name one of ...

The most common mistake is a URL without ``/v1`` (Ollama's and llama.cpp's address as people copy
it): the server answers 404 at ``/models``, and every turn then fails with 404.  The probe tries
``{base_url}/v1/models`` as well and says so (:attr:`ModelProbe.suggested_url`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

__all__ = ["SERVERS", "ModelProbe", "probe_models", "why_failed"]

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5)

# The usual servers and the address each listens on by default: what `switchboard setup` offers.
SERVERS: tuple[tuple[str, str], ...] = (
    ("Ollama", "http://127.0.0.1:11434/v1"),
    ("llama.cpp (llama-server)", "http://127.0.0.1:8080/v1"),
    ("vLLM (vllm serve)", "http://127.0.0.1:8000/v1"),
    ("LM Studio", "http://127.0.0.1:1234/v1"),
    ("OpenAI", "https://api.openai.com/v1"),
    ("another address: a hosted OpenAI-compatible API (OpenRouter, Together, Groq, ...) or a server elsewhere", ""),
)

# Where servers report a model's context window in their /models entries: vLLM (max_model_len),
# LM Studio (max_context_length), OpenRouter (context_length), llama.cpp (meta.n_ctx_train).
_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")


@dataclass(frozen=True, slots=True)
class ModelProbe:
    """What ``GET /models`` said: ``status`` None when nothing answered (``error`` says why)."""

    base_url: str
    status: int | None = None
    error: str | None = None
    served: tuple[str, ...] = ()
    listed: bool = False  # the server answered with a list of models (possibly empty)
    suggested_url: str | None = None  # base_url + /v1, when that answers and base_url does not
    context_lengths: dict[str, int] = field(default_factory=dict)

    @property
    def reachable(self) -> bool:
        return self.status is not None

    @property
    def refused_key(self) -> bool:
        return self.status in (401, 403)

    def serves(self, name: str) -> bool:
        """Whether ``name`` can be asked for here: listed, or the server lists none to check against."""
        return self.status is not None and self.status < 400 and (not self.served or name in self.served)

    def problem(self, name: str) -> str | None:
        """What is wrong for a model called ``name``, in words naming the URL; None when nothing is."""
        base = self.base_url
        if self.status is None:
            return f"cannot reach {base}: {self.error}"
        if self.refused_key:
            return f"{base} refused the API key (HTTP {self.status})"
        if self.status == 404:
            if self.suggested_url:
                return f"{base}/models answered 404: the OpenAI-compatible API is at {self.suggested_url}"
            return f"{base}/models answered 404: this is not an OpenAI-compatible API's base URL"
        if self.status >= 400:
            return f"{base}/models answered HTTP {self.status}"
        if self.served and name not in self.served:
            return f"{base} does not serve {name!r} (it has: {', '.join(self.served[:8])})"
        return None

    def fix(self, name: str, key: str = "model", variables: tuple[str | None, str | None] = (None, None)) -> str | None:
        """The likely fix for :meth:`problem`: the keys (and the variables that set them, given as
        ``(base_url's, name's)``) to set, to what."""
        url_var, name_var = variables

        def via(k: str, var: str | None, value: str) -> str:
            return f"set {k} to {value}" + (f" ({var}={value})" if var else "")

        if self.status is None:
            return (f"check {key}.base_url" + (f" ({url_var})" if url_var else "")
                    + " and that the model server is running; `switchboard setup` probes the usual local servers")
        if self.refused_key:
            return f"set {key}.api_key to a key this server accepts"
        if self.status == 404:
            if self.suggested_url:
                return via(f"{key}.base_url", url_var, self.suggested_url)
            return f"set {key}.base_url to the server's OpenAI-compatible base URL (it usually ends in /v1)"
        if self.status >= 400:
            return f"check {key}.base_url and the model server's log"
        if self.served and name not in self.served:
            return via(f"{key}.name", name_var, "one of " + ", ".join(self.served[:8]))
        return None

    def context_length(self, name: str) -> int | None:
        """The context window the server reports for ``name``, where it reports one."""
        return self.context_lengths.get(name)


def why_failed(exc: BaseException, timeout: float | None = None) -> str:
    """A failed request in a few words: refused, timed out, or the error's own text."""
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time (timed out)" if timeout is None else f"no answer within {timeout:g} s (timed out)"
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    return f"{type(exc).__name__} {exc}".strip()


async def _get_models(http: aiohttp.ClientSession, base: str, api_key: str) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with http.get(f"{base}/models", headers=headers) as r:
        body: object = None
        if r.status < 400:
            try:
                body = await r.json(content_type=None)
            except ValueError:
                body = None
        return r.status, body


def _entries(body: object) -> list[dict]:
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        return [m for m in body["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if isinstance(body, dict) and isinstance(body.get("models"), list):  # Ollama's own /api/tags shape
        return [{"id": m.get("name") or m.get("model"), **m} for m in body["models"]
                if isinstance(m, dict) and isinstance(m.get("name") or m.get("model"), str)]
    return []


def _context_of(entry: dict) -> int | None:
    for key in _CONTEXT_KEYS:
        value = entry.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    meta = entry.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("n_ctx_train"), int) and meta["n_ctx_train"] > 0:
        return int(meta["n_ctx_train"])
    return None


async def probe_models(http: aiohttp.ClientSession, base_url: str, api_key: str = "",
                       *, timeout: aiohttp.ClientTimeout = PROBE_TIMEOUT) -> ModelProbe:
    """``GET {base_url}/models`` (and ``{base_url}/v1/models`` when the first answers 404 and the URL
    does not end in /v1); never raises for a network failure: :attr:`ModelProbe.error` says it."""
    base = base_url.rstrip("/")
    try:
        status, body = await asyncio.wait_for(_get_models(http, base, api_key), timeout.total)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        return ModelProbe(base, error=why_failed(exc, timeout.total))
    suggested = None
    if status == 404 and not base.endswith("/v1"):
        try:
            v1_status, v1_body = await asyncio.wait_for(_get_models(http, base + "/v1", api_key), timeout.total)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            v1_status, v1_body = None, None
        if v1_status is not None and v1_status < 400:
            suggested = base + "/v1"
            entries = _entries(v1_body)
            return ModelProbe(base, status=404, suggested_url=suggested,
                              served=tuple(e["id"] for e in entries), listed=bool(entries),
                              context_lengths={e["id"]: c for e in entries if (c := _context_of(e))})
    entries = _entries(body)
    return ModelProbe(base, status=status, served=tuple(e["id"] for e in entries),
                      listed=isinstance(body, dict) and isinstance(body.get("data"), list),
                      context_lengths={e["id"]: c for e in entries if (c := _context_of(e))})
