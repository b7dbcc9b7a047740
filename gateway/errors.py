"""The gateway's errors.

    SwitchboardError                 root of everything the gateway raises on purpose
    ├── ConfigError                  the config file is wrong; carries file, key path, fix (exit 78)
    ├── KeyedError (ValueError)      _config_load.py: a config validator blames one key; never
    │                                leaves the config loader, which turns it into ConfigError
    ├── AdapterError                 a platform adapter could not start or deliver
    │   ├── PlatformHTTPError        the platform answered with an error status
    │   ├── RateLimited              the platform said "wait retry_after seconds" (not a failure)
    │   ├── TokenRejected            the platform refused the bot's token (401, 4004, invalid_auth):
    │   │                            not retried until a reload; .platform, .key, .help
    │   └── ...                      the adapters' own, drawn in ``adapters/__init__.py``
    ├── ModelUnavailable             the model endpoint failed after every retry
    │   ├── AnswerCutOff             a streamed answer broke off after some of it was shown (.partial)
    │   ├── EmptyAnswer              it answered with nothing (an empty stream, no text and no tool
    │   │   │                        call): never stored as an answer
    │   │   └── _EmptyStream         gateway/model.py: a stream that ended with no event; asked again
    │   │                            unstreamed, it never leaves the model client
    │   └── ModelRefused             it refused the request itself (4xx): retrying cannot help
    │       ├── ContextTooLong       400: the prompt is larger than the model's context window
    │       ├── AttachmentRefused    400: the endpoint refused a picture or a file in the prompt
    │       ├── ModelAuthRejected    401: the API key was refused
    │       ├── ModelForbidden       403: the key may not use this model
    │       └── ModelNotFound        404: no such model (or endpoint)
    ├── ApiError                     gateway/runtime/api_request.py: a request the local API
    │                                refuses, answered as OpenAI-shaped JSON (status, type, code,
    │                                param); never leaves the API's request handling
    ├── RpcError                     gateway/runtime/a2a_wire.py: an A2A JSON-RPC error answered to
    │                                the caller (.code, .status); never leaves the A2A endpoint
    ├── BudgetExceeded               a spend budget is used up: no model call was made (.state:
    │                                the rule, what it spent, when it resets)
    ├── GatewayClosing               the gateway is shutting down and takes no new message;
    │                                the platform or API client should send it again later
    ├── AlreadyRunning               another daemon holds this home's lock
    ├── ServiceError                 a systemd unit cannot be rendered, installed or removed as
    │                                asked; nothing was changed
    ├── BackupError                  a backup or restore was refused or failed; the live
    │                                database was left as it was
    ├── NotReplayable                a dead letter holds no message to replay
    ├── InvalidJob (ValueError)      a cron job definition names a bad field (.field, .reason)
    ├── InvalidMessage (ValueError)  an adapter built an InboundMessage the gateway cannot route (no
    │                                chat id, no platform); it is refused where it is made
    ├── MemoryRefused                the memory tool refused a change; the model is told why
    ├── FactRefused                  the facts tool refused a change; the model is told why
    ├── PlotsUnavailable             insights --plot needs matplotlib, an optional extra, not installed
    ├── AuthError                    gateway/tools_mcp/oauth.py: a sign-in to an MCP server could not be
    │                                started or finished; the person (or the model) is told why
    ├── VaultError                   gateway/tools_mcp/vault.py: a sealed sign-in cannot be opened with
    │                                the home's key; that sign-in is asked again
    ├── TooManyRounds                gateway/tools_mcp/rounds.py: an MCP server asked for input more
    │                                than MAX_ROUNDS times in one call; the model reads it as the error
    └── AttachError                  gateway/cli/chat.py: a file ``/attach`` cannot send (missing, too
                                     large); the terminal chat prints it and goes on

Every class is defined in this module and exported from ``gateway``, except
``KeyedError``, which is internal to the config loader
(``gateway/_config_load.py``), ``ApiError``, internal to the local API, ``RpcError``, internal to the A2A
endpoint, ``AttachError``, internal to the terminal chat, ``AuthError`` and ``VaultError``, internal
to the MCP servers' sign-ins, and ``TooManyRounds``, internal to an MCP call's input rounds.  The modules that raise them import them from
here, and the old names still work: ``gateway.router.GatewayClosing``,
``gateway.runtime.systemd.ServiceError``, ``gateway.runtime.backup.BackupError``,
``gateway.runtime.deadletters.NotReplayable``, ``gateway.cron.schedule.InvalidJob``,
``gateway.memory.files.MemoryRefused``, ``gateway.memory.facts.FactRefused``,
``gateway.plots.PlotsUnavailable``.
``InvalidJob`` is also a ``ValueError`` for callers that catch a bad value
that way.  Each message says what to do next.

Outside the tree: ``gateway/cli/config.py``'s ``ConfigFailure`` is a
``click.ClickException``, the way the CLI prints a ``ConfigError`` as one
line and exits 78; ``gateway/cli/common.py``'s ``_JsonError`` is one too, the
way any command's error is printed as ``{"error": ...}`` under ``--json``, and
``gateway/cli/setup/ask.py``'s ``SetupFailed`` too, the one line ``switchboard setup`` stops with.

``state.StateError`` is the store's own root (``state`` imports nothing from
the gateway), and ``compression.CompressionError`` the compressor's; the CLI
turns each into one line and an exit code.
"""

from __future__ import annotations


class SwitchboardError(Exception):
    """Something the gateway refuses or cannot do, said so the operator can act."""


class ConfigError(SwitchboardError):
    """The config file is invalid."""

    exit_code = 78  # EX_CONFIG: systemd's RestartPreventExitStatus keeps a broken config from looping

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None):
        self.file = file
        self.key = key
        where = ": ".join(p for p in (file, key) if p)
        super().__init__(f"{where}: {message}" if where else message)


class AdapterError(SwitchboardError):
    """A platform adapter failed."""


class PlatformHTTPError(AdapterError):
    """The platform answered with an error."""

    def __init__(self, platform: str, status: int, description: str):
        self.platform = platform
        self.status = status
        self.description = description
        super().__init__(f"{platform} answered {status}: {description}")


class RateLimited(AdapterError):
    """The platform asked us to wait before sending again."""

    def __init__(self, platform: str, retry_after: float):
        self.platform = platform
        self.retry_after = retry_after
        super().__init__(f"{platform} rate limit: retry after {retry_after:.1f}s")


class TokenRejected(AdapterError):
    """The platform refused the bot's token: retrying cannot help, so the daemon stops trying until a
    reload.  ``key`` is the config key that holds the token, ``help`` where to get a good one."""

    SUMMARY = "the token was rejected"

    def __init__(self, platform: str, key: str, help: str):
        self.platform = platform
        self.key = key
        self.help = help
        super().__init__(f"{platform}: {self.SUMMARY}: {help}")


class ModelUnavailable(SwitchboardError):
    """The model endpoint failed after every retry: a later message may work.

    ``kind`` says how: ``unreachable`` (no connection), ``timeout`` (no answer in time) or ``failing``
    (it answered with errors, or with nothing usable); the local API turns it into 502, 504 or 503."""

    def __init__(self, message: str = "", kind: str = "failing"):
        super().__init__(message)
        self.kind = kind


class AnswerCutOff(ModelUnavailable):
    """A streamed answer broke off midway; ``partial`` is the text that had arrived.  Ask again."""

    def __init__(self, partial: str, reason: str):
        self.partial = partial
        super().__init__(f"the answer was cut off: {reason}")


class EmptyAnswer(ModelUnavailable):
    """The model answered with nothing at all (an empty event stream, or no text and no tool call); it is
    not stored as an answer, so the message stays unanswered and the next turn answers it."""


class ModelRefused(ModelUnavailable):
    """The model endpoint refused the request with a 4xx; the same request would be refused again.

    Fix what the subclass names (the prompt, ``model.api_key``, ``model.name``) before trying again.
    """

    def __init__(self, status: int, summary: str):
        self.status = status
        super().__init__(summary)


class ContextTooLong(ModelRefused):
    """The prompt is larger than the model's context window (400, ``context_length_exceeded``):
    shorten the conversation with /compress, or start a new one with /new; check ``model.context_length``.
    ``window`` is the window the server named ("maximum context length is N tokens"), if it did."""

    def __init__(self, status: int, summary: str, window: int | None = None):
        self.window = window
        super().__init__(status, summary)


class AttachmentRefused(ModelRefused):
    """The endpoint refused a picture or a file the prompt carried (a 4xx naming an image or a file, such
    as ``invalid_image_format``): the turn is tried once more without them, and that file is not sent again."""


class ModelAuthRejected(ModelRefused):
    """The endpoint refused the API key (401): set ``model.api_key`` to a key the endpoint accepts."""


class ModelForbidden(ModelRefused):
    """The endpoint refused access (403): give ``model.api_key`` access to ``model.name``, or pick a model it may use."""


class ModelNotFound(ModelRefused):
    """The endpoint does not know the model (404): check ``model.name`` against the server's model list and
    ``model.base_url`` (it usually ends in /v1)."""


class BudgetExceeded(SwitchboardError):
    """A budget rule's scope spent its limit for this period; the call was not made.  ``state`` is a
    :class:`gateway.budgets.RuleState` (the rule, what it spent, when the period ends)."""

    def __init__(self, state: object, message: str):
        super().__init__(message)
        self.state = state


class GatewayClosing(SwitchboardError):
    """The gateway is shutting down and takes no new messages; the platform should redeliver later."""


class AlreadyRunning(SwitchboardError):
    """Another daemon is already running on this home."""



class ServiceError(SwitchboardError):
    """The unit cannot be rendered, installed or removed as asked; nothing was changed."""


class BackupError(SwitchboardError):
    """A backup or restore was refused or failed; the live database was left as it was."""


class NotReplayable(SwitchboardError):
    """The dead letter failed before it was read into a message, so there is nothing to replay.

    Read its raw event with 'switchboard deadletters show ID', then drop it with 'switchboard deadletters drop ID'.
    """


class InvalidJob(SwitchboardError, ValueError):
    """A job definition that cannot be used; the message says which field and how to fix it."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class InvalidMessage(SwitchboardError, ValueError):
    """An :class:`~gateway.types.InboundMessage` that cannot be routed; the message says which field is missing."""


class MemoryRefused(SwitchboardError):
    """A memory change was refused; the message says why and what to do instead."""


class FactRefused(SwitchboardError):
    """A fact change was refused; the message says why and what to do instead."""


class PlotsUnavailable(SwitchboardError):
    """--plot needs matplotlib, which is not installed: pip install 'switchboard[plots]' (or pip install matplotlib)"""

    def __init__(self) -> None:
        super().__init__(self.__doc__)
