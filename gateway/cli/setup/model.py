"""`switchboard setup`, the model: which server, which model, its window, and one real answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import click

from gateway.modelprobe import SERVERS, ModelProbe, probe_models, why_failed

from .ask import Ask, SetupFailed

COMPLETION_TIMEOUT = aiohttp.ClientTimeout(total=60)


@dataclass(frozen=True, slots=True)
class ModelChoice:
    base_url: str
    name: str
    api_key: str = ""
    context_length: int | None = None


def _local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


async def _probe_all(urls: list[str], api_key: str = "") -> list[ModelProbe]:
    async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=3)) as http:
        return list(await asyncio.gather(*(probe_models(http, url, api_key, timeout=aiohttp.ClientTimeout(total=3))
                                           for url in urls)))


async def _probe(url: str, api_key: str) -> ModelProbe:
    async with aiohttp.ClientSession(trust_env=False) as http:
        return await probe_models(http, url, api_key)


async def complete_once(choice: ModelChoice) -> str:
    """One real chat completion: the model's answer to a short hello (raises SetupFailed with why)."""
    headers = {"Authorization": f"Bearer {choice.api_key}"} if choice.api_key else {}
    body = {"model": choice.name, "max_tokens": 40,
            "messages": [{"role": "user", "content": "Say hello to a new user in one short sentence."}]}
    url = choice.base_url.rstrip("/") + "/chat/completions"
    try:
        async with aiohttp.ClientSession(trust_env=False, timeout=COMPLETION_TIMEOUT) as http:
            async with http.post(url, json=body, headers=headers) as r:
                data = await r.json(content_type=None)
                if r.status >= 400:
                    error = data.get("error") if isinstance(data, dict) else None
                    message = error.get("message") if isinstance(error, dict) else str(error or data)
                    raise SetupFailed(f"{url} answered HTTP {r.status}: {message}")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise SetupFailed(f"no answer from {url}: {why_failed(exc, COMPLETION_TIMEOUT.total)}") from None
    try:
        return str(data["choices"][0]["message"]["content"] or "").strip()
    except (KeyError, IndexError, TypeError):
        raise SetupFailed(f"{url} answered, but not as an OpenAI-compatible chat completion") from None


def choose_model(ask: Ask, *, url: str | None, name: str | None, api_key: str | None,
                 context_length: int | None) -> ModelChoice:
    """The model server and model: probed, the missing /v1 added, the served names offered."""
    ask.section("1. The model")
    if url is None:
        url = _pick_server(ask)
    key = api_key or ""
    while True:
        probe = asyncio.run(_probe(url, key))
        if probe.refused_key:
            ask.bad(f"{probe.base_url} refused the API key (HTTP {probe.status})")
            key = ask.secret("API key for this server")
            continue
        if probe.status == 404 and probe.suggested_url:
            ask.ok(f"{probe.base_url} answers at /v1: using {probe.suggested_url}")
            url = probe.suggested_url
            probe = asyncio.run(_probe(url, key))
        problem = probe.problem(name) if name else (None if probe.reachable and (probe.status or 500) < 400
                                                    else probe.problem(""))
        if probe.reachable and (probe.status or 500) < 400:
            break
        ask.bad(problem or f"{url} did not answer")
        if not ask.interactive:
            raise SetupFailed(f"{problem}; fix: {probe.fix(name or '', 'model') or 'pass --model-url'}")
        url = ask.text("Model server URL (it usually ends in /v1)", default=url)
    base_url = probe.base_url
    served = list(probe.served)
    ask.ok(f"{base_url} answers" + (f": it serves {', '.join(served[:8])}" + (" …" if len(served) > 8 else "")
                                   if served else " (it lists no models)"))
    if name is None:
        if len(served) == 1:
            name = served[0]
        elif served:
            name = ask.pick("Which model?", served, default=served[0])
        else:
            name = ask.text("Model name, as the server knows it", default=None)
    elif served and name not in served:
        ask.bad(f"{base_url} does not serve {name!r} (it has: {', '.join(served[:8])})")
        if not ask.interactive:
            raise SetupFailed(f"{base_url} does not serve {name!r}; pass --model one of {', '.join(served[:8])}")
        name = ask.pick("Which model?", served, default=served[0])
    ask.ok(f"model: {name}")
    window = context_length or probe.context_length(name)
    if window:
        ask.ok(f"context window: {window:,} tokens" + ("" if context_length else " (as the server reports it)"))
    else:
        from compression import context_length_for

        known, warning = context_length_for(name, None)
        if warning and ask.interactive:
            answer = ask.text("Its context window in tokens (Enter: 8192, compression starts early)", default="")
            window = int(answer) if answer.strip().isdigit() else None
        elif not warning:
            ask.ok(f"context window: {known:,} tokens (a well-known model)")
    choice = ModelChoice(base_url, name, key, window)
    ask.say("Asking the model for one real answer …")
    try:
        answer = asyncio.run(complete_once(choice))
    except SetupFailed as exc:
        ask.bad(str(exc))
        if not ask.confirm("Write the config anyway?", default=False):
            raise
    else:
        ask.ok(f"the model answered: {answer[:200]!r}")
    return choice


def _pick_server(ask: Ask) -> str:
    """Offer the usual servers, marking the local ones that answer now."""
    local = [(label, url) for label, url in SERVERS if url and _local(url)]
    found = asyncio.run(_probe_all([url for _, url in local]))
    answering = {p.base_url for p in found if p.reachable and (p.status or 500) < 400}
    options: list[str] = []
    for label, url in SERVERS:
        mark = " (answering now)" if url in answering else ""
        options.append(f"{label}{': ' + url if url else ''}{mark}")
    if not ask.interactive:
        first = next((url for _label, url in local if url in answering), None)
        if first is None:
            raise SetupFailed("no model server answers at the usual local addresses; pass --model-url URL")
        return first
    default = next((i for i, (_l, url) in enumerate(SERVERS) if url in answering), 0)
    chosen = ask.pick_index("Which model server?", options, default=default)
    label, url = SERVERS[chosen]
    if not url:
        url = ask.text("Its base URL (e.g. https://openrouter.ai/api/v1, http://192.168.1.5:11434)", default=None)
    elif not _local(url):
        click.echo(f"  {label}: {url}")
    return url
