"""Persistent memory, the layer always in the prompt: ``MEMORY.md`` and ``USER.md``, and the ``memory`` tool.

Files and limits::

    <home>/memory/<agent>/<user>/MEMORY.md   the agent's notes        2,200 characters
    <home>/memory/<agent>/<user>/USER.md     what it knows of the user 1,375 characters

``<user>`` is the user's identity name, else ``platform_userid``
(:func:`gateway.memory.identity.user_dir_name`).  Entries are separated by
``\\n§\\n``; ``replace`` and ``remove`` find an entry by a unique substring.

* Writes are safe between processes: an exclusive ``flock`` on a separate
  lock file, the file re-read under the lock, then a temporary file written,
  fsynced and renamed over the old one (readers see the old or the new file,
  never half of one).  Files are 0600, folders 0700.
* Content is scanned first: text that tries to instruct the model (the usual
  injection phrasings, chat-template role markers) or hides characters
  (zero-width, bidirectional overrides) is refused with the reason.
* Frozen snapshot: :meth:`MemoryService.prompt_block` reads the files once
  per session id, on its first turn, and returns the same text for every later
  turn of that session (the provider's prompt cache keeps working); the tool's
  answers show the live files.  The next session sees the changes.
* :func:`memory_flush_turn`: before a session is reset (or compressed) the
  agent gets one turn with only the memory tool to keep what matters.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from gateway import filelock
from gateway.errors import BudgetExceeded, MemoryRefused, ModelUnavailable
from gateway.memory.identity import user_dir_name
from gateway.tasks import spawn
from gateway.tools import Tool, ToolContext
from gateway.turn import AgentTurn
from gateway.usage import for_session
from state.atomic import write_atomically

log = logging.getLogger(__name__)

__all__ = [
    "FILES",
    "LIMITS",
    "SEPARATOR",
    "MemoryFiles",
    "MemoryRefused",
    "MemoryService",
    "memory_flush_turn",
    "scan_content",
]

SEPARATOR = "\n§\n"
FILES = {"memory": "MEMORY.md", "user": "USER.md"}
LIMITS = {"memory": 2200, "user": 1375}
FLUSH_MIN_MESSAGES = 4
SNAPSHOTS_KEPT = 10_000  # sessions whose frozen snapshot stays in memory (least recently used dropped)


# --------------------------------------------------------------------------- scanning

_THREATS: list[tuple[str, re.Pattern]] = [(why, re.compile(rx, re.IGNORECASE)) for why, rx in [
    ("it tells the model to ignore its instructions",
     r"\b(ignore|disregard|forget|override|bypass)\s+(all\s+|any\s+|of\s+)*(the\s+|your\s+|my\s+|these\s+|those\s+)?"
     r"((previous|prior|above|earlier|preceding|system|original|safety)\s+)?(instructions|prompts?|rules|guidelines|directives)\b"),
    ("it tells the model to forget what it was told", r"\bforget\s+(everything|all)\b[^.\n]{0,30}\b(told|know|said|instructions?)\b"),
    ("it tries to give the model a new role", r"\byou\s+are\s+(now|no\s+longer)\b|\bfrom\s+now\s+on,?\s+you\s+(are|will|must)\b"),
    ("it claims to be new instructions", r"\b(new|updated|real|actual)\s+(system\s+)?(instructions|prompt|rules)\s*:"),
    ("it asks to reveal the system prompt", r"\b(reveal|print|show|repeat|leak|output)\b[^.\n]{0,20}\b(system\s+prompt|hidden\s+instructions)\b"),
    ("it asks to hide something from the user", r"\b(do\s+not|don't|never)\s+(tell|inform|mention\s+to|show)\s+the\s+user\b|\bhide\s+(this|it)\s+from\s+the\s+user\b"),
    ("it tries to switch off safety rules", r"\b(jailbreak|developer\s+mode|DAN\s+mode|no\s+restrictions|without\s+(any\s+)?restrictions)\b"),
    ("it asks to send secrets somewhere",
     r"\b(send|post|upload|exfiltrate|forward)\b[^.\n]{0,40}\b(api[\s_-]?keys?|passwords?|tokens?|secrets?|credentials?|\.env)\b[^.\n]{0,30}\b(to|at)\b"),
    ("it contains a shell command that fetches and runs code", r"\b(curl|wget)\b[^\n]{0,80}\|\s*(ba|z)?sh\b"),
    ("it contains a chat role marker", r"(^|\n)\s*(system|assistant|developer)\s*:\s"),
    ("it contains a chat-template marker", r"<\|(im_start|im_end|system|user|assistant|endoftext)\|>|\[/?INST\]|<</?SYS>>|</?(system|assistant)>"),
    ("it contains a prompt section header", r"(^|\n)\s*#{1,6}\s*(system|instructions?)\s*(prompt)?\s*(:|\n|$)"),
]]

_INVISIBLE = {0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180E, 0x3164, 0xFEFF, 0xFFA0}
_INVISIBLE.update(range(0x200B, 0x2010))  # zero-width space/joiners, LRM/RLM
_INVISIBLE.update(range(0x202A, 0x202F))  # bidirectional embeddings and overrides
_INVISIBLE.update(range(0x2060, 0x2070))  # word joiner, invisible operators, bidi isolates
_INVISIBLE.update(range(0xE0000, 0xE0080))  # tag characters
_INVISIBLE.update(range(0xFE00, 0xFE10))  # variation selectors


def scan_content(text: str) -> str | None:
    """Why ``text`` may not be stored in memory, or None when it may."""
    for ch in text:
        code = ord(ch)
        if code in _INVISIBLE or (unicodedata.category(ch) == "Cc" and ch not in "\n\t"):
            name = unicodedata.name(ch, "control character")
            return f"it contains an invisible or text-direction character (U+{code:04X} {name}); write it as plain text"
    for why, pattern in _THREATS:
        m = pattern.search(text)
        if m:
            return f"{why} ({m.group(0).strip()!r}); memory keeps facts and preferences, not instructions to the model"
    return None


# --------------------------------------------------------------------------- files


@dataclass(frozen=True, slots=True)
class MemoryState:
    target: str
    entries: tuple[str, ...]
    limit: int

    @property
    def used(self) -> int:
        return len(SEPARATOR.join(self.entries))

    def listing(self) -> str:
        if not self.entries:
            return "(empty)"
        return "\n".join(f"{n}. {e}" for n, e in enumerate(self.entries, 1))

    def header(self) -> str:
        return f"{FILES[self.target]} [{self.used:,}/{self.limit:,} characters, {len(self.entries)} entries]"


def _split(raw: str) -> list[str]:
    return [e.strip() for e in raw.split(SEPARATOR) if e.strip()]


class MemoryFiles:
    """One user's MEMORY.md and USER.md (synchronous: call from a thread in the daemon)."""

    def __init__(self, folder: Path, limits: dict[str, int] | None = None):
        self.folder = Path(folder)
        self.limits = dict(LIMITS if limits is None else limits)

    def path(self, target: str) -> Path:
        if target not in FILES:
            raise MemoryRefused(f"unknown target {target!r}; use \"memory\" (your notes) or \"user\" (about the user)")
        return self.folder / FILES[target]

    def read(self, target: str) -> MemoryState:
        path = self.path(target)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raw = ""
        return MemoryState(target, tuple(_split(raw)), self.limits[target])

    def add(self, target: str, content: str) -> MemoryState:
        content = _clean(content)
        with self._locked(target):
            state = self.read(target)
            if content in state.entries:
                return state
            entries = (*state.entries, content)
            self._check_room(state, entries, f"adding {len(content):,} characters")
            return self._write(target, entries)

    def replace(self, target: str, old_text: str, content: str) -> MemoryState:
        content = _clean(content)
        with self._locked(target):
            state = self.read(target)
            i = self._find(state, old_text)
            entries = tuple(content if n == i else e for n, e in enumerate(state.entries))
            self._check_room(state, entries, "the replacement")
            return self._write(target, entries)

    def remove(self, target: str, old_text: str) -> MemoryState:
        with self._locked(target):
            state = self.read(target)
            i = self._find(state, old_text)
            return self._write(target, tuple(e for n, e in enumerate(state.entries) if n != i))

    # -- helpers -------------------------------------------------------------------
    def _find(self, state: MemoryState, old_text: str) -> int:
        needle = (old_text or "").strip()
        if not needle:
            raise MemoryRefused("old_text is empty; give a piece of the entry to change, unique to it.\n"
                                f"Current entries of {state.header()}:\n{state.listing()}")
        matches = [i for i, e in enumerate(state.entries) if needle in e]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise MemoryRefused(f"no entry contains {needle!r}. Current entries of {state.header()}:\n{state.listing()}")
        candidates = "\n".join(f"- {state.entries[i]}" for i in matches)
        raise MemoryRefused(f"{len(matches)} entries contain {needle!r}; give a longer piece, unique to one of them:\n{candidates}")

    def _check_room(self, state: MemoryState, entries: tuple[str, ...], what: str) -> None:
        size = len(SEPARATOR.join(entries))
        if size > state.limit:
            raise MemoryRefused(
                f"{FILES[state.target]} is full: {what} would make it {size:,} of {state.limit:,} characters. "
                "Consolidate first: replace several entries with one shorter entry, or remove what is no longer "
                f"true, then try again. Current entries ({state.used:,} characters):\n{state.listing()}"
            )

    def _locked(self, target: str) -> filelock.FileLock:
        """The exclusive lock on a lock file beside the memory file, held for the ``with`` block."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return filelock.lock(self.folder / f".{self.path(target).name}.lock")

    def _write(self, target: str, entries: tuple[str, ...]) -> MemoryState:
        text = SEPARATOR.join(entries) + ("\n" if entries else "")
        write_atomically(self.path(target), text.encode("utf-8"), sync_folder=True)  # the rename survives a crash
        return MemoryState(target, entries, self.limits[target])


def _clean(content: str) -> str:
    text = (content or "").strip()
    if not text:
        raise MemoryRefused("content is empty; say what to remember")
    if SEPARATOR.strip() in text.split("\n"):
        raise MemoryRefused("content may not contain a line holding only '§' (it separates entries); store one entry per call")
    why = scan_content(text)
    if why:
        raise MemoryRefused(f"not stored: {why}")
    return text


# --------------------------------------------------------------------------- the service


MEMORY_SCHEMA = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "enum": ["memory", "user"],
                   "description": "memory: your own notes (facts, conventions, lessons); user: what you know about the user."},
        "action": {"type": "string", "enum": ["add", "replace", "remove"]},
        "content": {"type": "string", "description": "The entry to add, or the new text for replace. One fact per entry, short."},
        "old_text": {"type": "string", "description": "For replace and remove: a piece of the existing entry, unique to it."},
    },
    "required": ["target", "action"],
    "additionalProperties": False,
}


class MemoryService:
    """Memory for the daemon: the files of each user, frozen snapshots, the tool, the flush turn."""

    def __init__(self, config, *, limits: dict[str, int] | None = None):
        self.config = config
        self.root = Path(config.home) / "memory"
        self.limits = dict(LIMITS if limits is None else limits)
        self._snapshots: collections.OrderedDict[str, str | None] = collections.OrderedDict()
        self._flushes: dict[str, asyncio.Task] = {}  # session key -> its pending pre-reset flush

    def files_for(self, agent: str, platform: str, user_id: str | None) -> MemoryFiles | None:
        name = user_dir_name(self.config, platform, user_id)
        if name is None:
            return None
        return MemoryFiles(self.root / _safe(agent) / name, self.limits)

    # -- the frozen snapshot -----------------------------------------------------------
    def render_block(self, files: MemoryFiles) -> str | None:
        notes, user = files.read("memory"), files.read("user")
        if not notes.entries and not user.entries:
            return None
        parts = ["## Persistent memory (as saved when this session started; changes you make apply from the next session)"]
        for state, label in ((notes, "Your notes"), (user, "About the user")):
            if state.entries:
                parts.append(f"{label} — {state.header()}:\n" + SEPARATOR.join(state.entries))
        return "\n\n".join(parts)

    async def prompt_block(self, req, session_id: str) -> str | None:
        """The memory block of ``session_id``'s system prompt: read on its first turn, then frozen."""
        if session_id in self._snapshots:
            self._snapshots.move_to_end(session_id)
            return self._snapshots[session_id]
        pending = self._flushes.get(req.session_key)
        if pending is not None and not pending.done():
            # the previous session's keep-what-matters turn is still writing: let it finish first
            await asyncio.wait([pending], timeout=self.config.model.timeout_seconds)
        files = self.files_for(_agent_of(req.session_key, self.config.agent), req.platform, req.user_id)
        block = await asyncio.to_thread(self.render_block, files) if files is not None else None
        self._snapshots[session_id] = block
        while len(self._snapshots) > SNAPSHOTS_KEPT:
            self._snapshots.popitem(last=False)
        return block

    # -- the tool ----------------------------------------------------------------------------
    async def apply(self, ctx: ToolContext, args: dict) -> str:
        files = self.files_for(ctx.agent, ctx.platform, ctx.user_id)
        if files is None:
            return "error: memory is kept per user, and this conversation has no user"
        target = str(args.get("target") or "memory")
        action = str(args.get("action") or "")
        content = args.get("content")
        old_text = args.get("old_text")
        try:
            if action == "add":
                state = await asyncio.to_thread(files.add, target, str(content or ""))
                done = "Added."
            elif action == "replace":
                state = await asyncio.to_thread(files.replace, target, str(old_text or ""), str(content or ""))
                done = "Replaced."
            elif action == "remove":
                state = await asyncio.to_thread(files.remove, target, str(old_text or ""))
                done = "Removed."
            else:
                return f"error: unknown action {action!r}; use add, replace or remove"
        except MemoryRefused as exc:
            return f"error: {exc}"
        log.info("memory %s on %s for %s:%s", action, FILES[target], ctx.platform, ctx.user_id)
        return (f"{done} {state.header()} now holds:\n{state.listing()}\n"
                "(Saved; it appears in the system prompt from the next session on.)")

    def tool(self) -> Tool:
        return Tool(
            name="memory",
            description=(
                "Keep short facts across sessions. target=memory: your own notes (environment facts, conventions, "
                "lessons); target=user: what you know about this user (preferences, habits, names). "
                "action=add with content; action=replace with old_text (a unique piece of the entry) and content; "
                "action=remove with old_text. Space is small: keep entries short and consolidate when full. "
                "Store facts, never instructions."
            ),
            parameters=MEMORY_SCHEMA,
            handler=self.apply,
        )

    # -- the pre-reset turn --------------------------------------------------------------
    def schedule_flush(self, turn: AgentTurn, session_id: str, session_key: str, reason: str = "reset") -> asyncio.Task:
        """Run :func:`memory_flush_turn` for an ended session in the background; the next
        session on ``session_key`` waits for it before reading its snapshot."""
        task = spawn(memory_flush_turn(turn, self, session_id, reason=reason), name=f"memory-flush:{session_id}")
        self._flushes[session_key] = task

        def done(t: asyncio.Task) -> None:
            if self._flushes.get(session_key) is t:
                del self._flushes[session_key]

        task.add_done_callback(done)
        return task

    async def drain(self, timeout: float) -> None:
        """At shutdown: let running flushes finish within ``timeout``, cancel the rest."""
        tasks = [t for t in self._flushes.values() if not t.done()]
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%d memory flush(es) cancelled at shutdown", len(pending))
            await asyncio.wait(pending, timeout=5)


FLUSH_PROMPT = (
    "[System: this session is about to be {reason}, and its conversation will not be in your context "
    "afterwards. Use the memory tool now to keep what will matter in later sessions: durable facts about "
    "the user (preferences, names, plans) with target=user, and your own lessons or environment facts with "
    "target=memory. Skip what is already in memory, trivial or temporary. If nothing is worth keeping, "
    "answer \"nothing to keep\" without calling the tool.]"
)
FLUSH_MAX_CALLS = 4


async def memory_flush_turn(turn: AgentTurn, memory: "MemoryService | None", session_id: str, *,
                            reason: str = "reset", min_messages: int = FLUSH_MIN_MESSAGES) -> bool:
    """Give the agent one turn, with only the memory tool, to keep what matters of ``session_id``.

    ``turn`` runs it (its store, model, tools and tool loop); ``memory`` shows the model what memory
    holds now, so it adds only what is new.
    ``reason`` completes "this session is about to be ...": "reset" or "compressed".  Skipped
    (returns False) for sessions with fewer than ``min_messages`` messages, for cron sessions and
    when no memory tool is registered.  Nothing is added to the session's history; the model's
    writes land in the memory files.  Never raises for a model failure (logged, returns False).
    """
    db, tools = turn.db, turn.tools
    if "memory" not in tools.names():
        return False
    session = await db.sessions.get(session_id)
    if session is None:
        return False
    key = session.session_key or ""
    if session.source == "cron" or ":cron:" in key:
        return False
    history = await db.messages.as_conversation(session_id)
    if len([m for m in history if m.get("role") in ("user", "assistant")]) < min_messages:
        return False
    platform = session.source or "?"
    ctx = ToolContext(session_id=session_id, session_key=key, platform=platform, user_id=session.user_id,
                      agent=_agent_of(key, turn.settings.agent))
    system = turn.system_prompt(platform, session.started_at)
    files = memory.files_for(ctx.agent, platform, ctx.user_id) if memory is not None else None
    live = await asyncio.to_thread(memory.render_block, files) if memory is not None and files is not None else None
    if live:
        system += "\n\n" + live.replace("as saved when this session started; changes you make apply from the next session",
                                         "as it is now")
    prompt = [{"role": "system", "content": system}, *history,
              {"role": "user", "content": FLUSH_PROMPT.format(reason=reason)}]
    try:
        loop = await turn.tool_loop(prompt, ctx, tool_names={"memory"}, max_iterations=FLUSH_MAX_CALLS,
                                    max_tool_calls=FLUSH_MAX_CALLS,
                                    purpose=for_session("memory_flush", session_id, key, platform=platform,
                                                        user_id=ctx.user_id, agent=ctx.agent))
    except ModelUnavailable as exc:
        log.warning("memory flush before %s of %s skipped: model unavailable (%s)", reason, session_id, exc)
        return False
    except BudgetExceeded as exc:
        log.info("memory flush before %s of %s skipped: %s", reason, session_id, exc)
        return False
    log.info("memory flush before %s of %s: %d memory call(s)", reason, session_id, loop.tool_calls)
    return True


def _agent_of(session_key: str | None, default: str) -> str:
    parts = (session_key or "").split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "agent" and parts[1] else default


def _safe(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return "_" + safe[1:] if safe.startswith(".") else safe
