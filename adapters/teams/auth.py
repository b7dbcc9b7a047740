"""The Bot Framework's two tokens: the one on every inbound activity (checked), and the bot's own (fetched).

Inbound (:class:`ActivityVerifier`): every POST to the messaging endpoint carries
``Authorization: Bearer <JWT>`` signed by the Bot Framework.  The token is accepted only when

- its header names an RS256 key (``kid``) published in the JWKS that the OpenID metadata document
  (``openid_metadata_url``) points at; the keys are read at start, again every
  ``keys_refresh_seconds``, and at once when a token names a key id we do not hold (Microsoft
  rotates them), at most once per :data:`UNKNOWN_KID_REFRESH_SECONDS`, so a flood of made-up key
  ids cannot make us hammer the metadata server;
- where that key lists ``endorsements``, the activity's ``channelId`` is one of them;
- its signature verifies, ``iss`` is the Bot Framework's issuer, ``aud`` is our app id, and it is
  within ``exp``/``nbf`` (5 minutes of clock skew allowed, as the Bot Framework SDKs allow);
- its ``serviceUrl`` claim, when present, equals the activity's ``serviceUrl``: a token lifted
  from one activity cannot send our replies (and our bearer token) to another host.

Anything else raises :class:`Unauthorized`, and the endpoint answers 401 before the activity is
read any further.  Verifying one RS256 signature costs tens of microseconds of CPU
(bench/teams.py prints it), so it runs on the event loop; fetching keys never blocks it.

Outbound (:class:`BotToken`): replies go to the activity's ``serviceUrl`` with the bot's own token,
from the OAuth client-credentials grant at ``token_url``; it is cached until
:data:`EXPIRY_MARGIN_SECONDS` before it expires and fetched by one caller at a time.  A refusal of
the app id or secret (``invalid_client``, ``unauthorized_client``, HTTP 401) raises
:class:`CredentialsRejected`, which nothing retries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import aiohttp
import jwt

from gateway.errors import AdapterError, PlatformHTTPError, RateLimited

log = logging.getLogger(__name__)

PLATFORM = "teams"
CLOCK_SKEW_SECONDS = 300
UNKNOWN_KID_REFRESH_SECONDS = 30.0
EXPIRY_MARGIN_SECONDS = 300.0
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=20)
REJECTED_HELP = ("Microsoft rejected the bot's app id or secret ({why}); nothing is sent until it is fixed: "
                 "put a current client secret of app {app} in platforms.teams.app_password "
                 "(Azure portal: the app registration -> Certificates & secrets) and reload")


class Unauthorized(AdapterError):
    """An inbound activity whose token is missing, malformed, unsigned or signed by a key we do not trust."""


class CredentialsRejected(AdapterError):
    """The token endpoint refused the bot's app id or secret: retrying cannot help."""


@dataclass(frozen=True, slots=True)
class _Key:
    key: object
    endorsements: frozenset[str] | None


class ActivityVerifier:
    """Checks the bearer token of inbound activities against the OpenID metadata's keys."""

    def __init__(self, http: aiohttp.ClientSession, *, metadata_url: str, issuer: str, app_id: str,
                 refresh_seconds: float, clock=time.monotonic):
        self._http = http
        self._metadata_url = metadata_url
        self._issuer = issuer
        self._app_id = app_id
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._read_at = float("-inf")
        self._unknown_read_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    async def load(self) -> None:
        """Read the metadata and its keys now (raises :class:`AdapterError` when they cannot be read)."""
        async with self._lock:
            await self._read()

    async def _read(self) -> None:
        try:
            async with self._http.get(self._metadata_url, timeout=HTTP_TIMEOUT) as resp:
                if resp.status != 200:
                    raise AdapterError(f"teams: the OpenID metadata at {self._metadata_url} answered {resp.status}")
                metadata = await resp.json(content_type=None)
            jwks_uri = metadata.get("jwks_uri") if isinstance(metadata, dict) else None
            if not isinstance(jwks_uri, str):
                raise AdapterError(f"teams: the OpenID metadata at {self._metadata_url} names no jwks_uri")
            async with self._http.get(jwks_uri, timeout=HTTP_TIMEOUT) as resp:
                if resp.status != 200:
                    raise AdapterError(f"teams: the signing keys at {jwks_uri} answered {resp.status}")
                jwks = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise AdapterError(f"teams: cannot read the signing keys from {self._metadata_url}: "
                               f"{type(exc).__name__}: {exc}") from None
        keys: dict[str, _Key] = {}
        for entry in jwks.get("keys", []) if isinstance(jwks, dict) else []:
            try:
                parsed = jwt.PyJWK.from_dict(entry)
            except Exception as exc:  # noqa: BLE001 - one unreadable key does not hide the others
                log.warning("teams: skipping an unreadable signing key: %s", exc)
                continue
            kid = entry.get("kid")
            if isinstance(kid, str) and kid:
                endorsed = entry.get("endorsements")
                keys[kid] = _Key(parsed.key, frozenset(map(str, endorsed)) if isinstance(endorsed, list) else None)
        if not keys:
            raise AdapterError(f"teams: the JWKS behind {self._metadata_url} holds no usable signing key")
        self._keys = keys
        self._read_at = self._clock()
        log.debug("teams: %d signing keys read", len(keys))

    async def _key(self, kid: str) -> _Key | None:
        if kid in self._keys and self._clock() - self._read_at < self._refresh_seconds:
            return self._keys[kid]
        async with self._lock:
            now = self._clock()
            stale = now - self._read_at >= self._refresh_seconds
            # an unknown key id reads the keys again, but no more than once per UNKNOWN_KID_REFRESH_SECONDS
            unknown = kid not in self._keys and now - self._unknown_read_at >= UNKNOWN_KID_REFRESH_SECONDS
            if stale or unknown:
                if unknown:
                    self._unknown_read_at = now
                try:
                    await self._read()
                except AdapterError as exc:  # keep the keys we have; the next one tries again
                    log.warning("%s", exc)
        return self._keys.get(kid)

    async def verify(self, authorization: str | None, activity: dict) -> dict:
        """The token's claims, or raises :class:`Unauthorized` naming what was wrong (never the token)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("no bearer token")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthorized("the token is not a JWT") from None
        if header.get("alg") != "RS256":
            raise Unauthorized(f"the token is signed with {header.get('alg')!r}, not RS256")
        kid = header.get("kid")
        key = await self._key(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthorized("the token is signed with a key the OpenID metadata does not publish")
        channel = activity.get("channelId")
        if key.endorsements is not None and channel not in key.endorsements:
            raise Unauthorized(f"the signing key is not endorsed for channel {channel!r}")
        return self.check(token, key.key, activity)

    def check(self, token: str, key: object, activity: dict) -> dict:
        """The signature and claims of ``token`` under ``key`` (CPU only; bench/teams.py times it)."""
        try:
            claims = jwt.decode(token, key, algorithms=["RS256"], audience=self._app_id, issuer=self._issuer,
                                leeway=CLOCK_SKEW_SECONDS, options={"require": ["exp", "iss", "aud"]})
        except jwt.InvalidTokenError as exc:
            raise Unauthorized(f"the token was refused: {exc}") from None
        service_url = claims.get("serviceurl") or claims.get("serviceUrl")
        if service_url is not None and service_url != activity.get("serviceUrl"):
            raise Unauthorized("the token was issued for another serviceUrl")
        return claims


class BotToken:
    """The bot's own bearer token (client credentials), cached until shortly before it expires."""

    def __init__(self, http: aiohttp.ClientSession, *, token_url: str, app_id: str, secret: str, scope: str,
                 clock=time.monotonic):
        self._http = http
        self._token_url = token_url
        self._app_id = app_id
        self._secret = secret
        self._scope = scope
        self._clock = clock
        self._token: str | None = None
        self._until = float("-inf")
        self._lock = asyncio.Lock()
        self.rejected: str | None = None  # why the credentials were refused, once they were
        self.fetches = 0

    async def get(self) -> str:
        if self.rejected is not None:
            raise CredentialsRejected(self.rejected)
        if self._token is not None and self._clock() < self._until:
            return self._token
        async with self._lock:
            if self._token is not None and self._clock() < self._until:
                return self._token
            return await self._fetch()

    def forget(self) -> None:
        """A 401 from the service: fetch a new token next time."""
        self._token, self._until = None, float("-inf")

    async def _fetch(self) -> str:
        form = {"grant_type": "client_credentials", "client_id": self._app_id, "client_secret": self._secret,
                "scope": self._scope}
        self.fetches += 1
        try:
            async with self._http.post(self._token_url, data=form, timeout=HTTP_TIMEOUT) as resp:
                text = await resp.text()
                status, headers = resp.status, resp.headers
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise AdapterError(f"teams: cannot reach the token endpoint: {type(exc).__name__}: {exc}") from None
        try:
            body = json.loads(text) if text else {}
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        if status == 429:
            raise RateLimited(PLATFORM, _retry_after(headers))
        error = str(body.get("error") or "")
        if status == 401 or error in ("invalid_client", "unauthorized_client"):
            why = error or f"HTTP {status}"
            code = str(body.get("error_codes", [""])[0]) if isinstance(body.get("error_codes"), list) else ""
            self.rejected = REJECTED_HELP.format(why=f"{why} {code}".strip(), app=self._app_id)
            log.error("teams: %s", self.rejected)
            raise CredentialsRejected(self.rejected)
        if status != 200 or not isinstance(body.get("access_token"), str):
            raise PlatformHTTPError(PLATFORM, status, f"token endpoint: {error or 'no access_token'}")
        try:
            lifetime = float(body.get("expires_in", 3600))
        except (TypeError, ValueError):
            lifetime = 3600.0
        self._token = body["access_token"]
        self._until = self._clock() + max(0.0, lifetime - EXPIRY_MARGIN_SECONDS)
        return self._token


def _retry_after(headers) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After", "1")))
    except (TypeError, ValueError):
        return 1.0
