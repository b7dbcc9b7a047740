"""The coroutines of :class:`state.AsyncSessionDB`, for the type checker only.

Generated from the marked methods of ``state/db.py`` and its repositories: do not edit, run ``.venv/bin/python -m state._gen_aio_face``.
"""

from typing import IO, Any, Callable, Iterable

from ._dialect import StoreSize
from ._fence import Fence, Handback
from ._messages import Appended
from ._replays import Claim
from ._split import Split
from ._storage import StorageReport
from ._turns import ContextQuery, TurnContext
from ._upkeep import PruneStep, Timed
from .records import DeliveryRecord, Session, StoredMessage
from .search import MergeStep

class AsyncSessions:
    """Sessions's marked methods (``adb.sessions``), each a coroutine."""

    async def create(
        self,
        session_id: str,
        source: str,
        model: str | None = ...,
        user_id: str | None = ...,
        parent_session_id: str | None = ...,
        *,
        system_prompt: str | None = ...,
        model_config: Any = ...,
        session_key: str | None = ...,
        user_name: str | None = ...,
        title: str | None = ...,
    ) -> str: ...
    async def get(self, session_id: str) -> Session | None: ...
    async def end(self, session_id: str, end_reason: str) -> bool: ...
    async def reopen(self, session_id: str) -> bool: ...
    async def update_system_prompt(self, session_id: str, system_prompt: str | None) -> bool: ...
    async def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = ...,
        output_tokens: int = ...,
        cache_read_tokens: int = ...,
        cache_write_tokens: int = ...,
        reasoning_tokens: int = ...,
        *,
        estimated_cost_usd: float | None = ...,
        actual_cost_usd: float | None = ...,
        model: str | None = ...,
        billing_provider: str | None = ...,
        billing_base_url: str | None = ...,
        billing_mode: str | None = ...,
        cost_status: str | None = ...,
        cost_source: str | None = ...,
        pricing_version: str | None = ...,
    ) -> bool: ...
    async def resolve_id(self, prefix_or_title: str) -> str: ...
    async def resolve_exactly(self, ref: str) -> str: ...
    async def find_owned(self, ref: str, *, source: str, user_ids: Iterable[str]) -> tuple[str | None, list[str]]: ...
    async def list_rich(
        self,
        source: str | None = ...,
        limit: int = ...,
        offset: int = ...,
        include_children: bool = ...,
        user_ids: Iterable[str] | None = ...,
        session_key: str | None = ...,
        *,
        user: str | None = ...,
        title_contains: str | None = ...,
        active_since: float | None = ...,
        active_before: float | None = ...,
    ) -> list[dict]: ...
    async def count(self, source: str | None = ...) -> int: ...
    async def lineage(self, session_id: str) -> list[Session]: ...
    async def descendants(self, session_id: str) -> list[Session]: ...
    async def compression_tip(self, session_id: str) -> str: ...
    async def delete(self, session_id: str) -> bool: ...
    async def prune_candidates(self, older_than_days: float = ..., source: str | None = ...) -> list[str]: ...
    async def prune(self, older_than_days: float = ..., source: str | None = ...) -> int: ...


class AsyncMessages:
    """Messages's marked methods (``adb.messages``), each a coroutine."""

    async def append(
        self,
        session_id: str,
        role: str,
        content: str | None = ...,
        tool_call_id: str | None = ...,
        tool_calls: Any = ...,
        tool_name: str | None = ...,
        token_count: int | None = ...,
        finish_reason: str | None = ...,
        reasoning: str | None = ...,
        reasoning_details: Any = ...,
        codex_reasoning_items: Any = ...,
        *,
        platform_message_id: str | None = ...,
        timestamp: float | None = ...,
    ) -> int: ...
    async def append_many(self, session_id: str, messages: list[dict]) -> list[int]: ...
    async def append_inbound(
        self,
        session_id: str,
        content: str | None,
        *,
        platform_message_id: str | None,
        role: str = ...,
        timestamp: float | None = ...,
        inbox: dict | None = ...,
        pending: bool = ...,
        **fields: Any,
    ) -> Appended: ...
    async def append_inbound_to_route(
        self,
        session_key: str,
        content: str | None,
        *,
        platform_message_id: str | None,
        keep: Callable[[dict], bool] = ...,
        role: str = ...,
        timestamp: float | None = ...,
        inbox: dict | None = ...,
        pending: bool = ...,
        **fields: Any,
    ) -> tuple[dict | None, Appended | None]: ...
    async def record_turn(
        self,
        session_id: str,
        messages: list[dict],
        *,
        input_tokens: int = ...,
        output_tokens: int = ...,
        answered: Iterable[int] = ...,
        delivery: DeliveryRecord | None = ...,
        fence: Fence | None = ...,
        inbox: Iterable[int] | None = ...,
    ) -> list[int]: ...
    async def get(self, session_id: str) -> list[StoredMessage]: ...
    async def as_conversation(self, session_id: str, upto: int | None = ...) -> list[dict]: ...
    async def unanswered_with_history(self, session_id: str) -> tuple[list[dict], list[dict]]: ...
    async def count(self, session_id: str | None = ...) -> int: ...
    async def clear(self, session_id: str) -> int: ...


class AsyncTitles:
    """Titles's marked methods (``adb.titles``), each a coroutine."""

    async def get(self, session_id: str) -> str | None: ...
    async def session(self, title: str) -> dict | None: ...
    async def resolve(self, title: str) -> str | None: ...
    async def next_in_lineage(self, base_title: str) -> str: ...
    async def set(self, session_id: str, title: str | None) -> bool: ...


class AsyncRoutes:
    """Routes's marked methods (``adb.routes``), each a coroutine."""

    async def session(self, session_key: str) -> dict | None: ...
    async def get(self, session_key: str) -> str | None: ...
    async def delete(self, session_key: str) -> bool: ...
    async def set(self, session_key: str, session_id: str) -> None: ...
    async def list(self, prefix: str | None = ...) -> list[tuple[str, str]]: ...


class AsyncCompression:
    """Compression's marked methods (``adb.compression``), each a coroutine."""

    async def split(
        self,
        session_id: str,
        messages: list[dict],
        *,
        expected_message_ids: Iterable[int],
        session_key: str | None = ...,
        end_reason: str = ...,
    ) -> Split: ...
    async def continued_conversation(self, session_id: str, upto: int | None = ...) -> tuple[str, list[dict]]: ...


class AsyncSearch:
    """Search's marked methods (``adb.search``), each a coroutine."""

    async def messages(
        self,
        query: str,
        source_filter: list[str] | None = ...,
        exclude_sources: list[str] | None = ...,
        role_filter: list[str] | None = ...,
        limit: int = ...,
    ) -> list[dict]: ...


class AsyncRecall:
    """Recall's marked methods (``adb.recall``), each a coroutine."""

    async def hits(
        self,
        query: str,
        *,
        agent_prefix: str | None,
        accounts: Iterable[str] | None,
        exclude_lineage_of: str | None = ...,
        role_filter: Iterable[str] | None = ...,
        limit: int = ...,
    ) -> dict: ...
    async def recent_sessions(
        self,
        *,
        agent_prefix: str | None,
        accounts: Iterable[str] | None,
        exclude_lineage_of: str | None = ...,
        limit: int = ...,
    ) -> list[dict]: ...
    async def sessions(self, session_ids: list[str]) -> list[dict]: ...


class AsyncRecovery:
    """Recovery's marked methods (``adb.recovery``), each a coroutine."""

    async def settle_inbox(
        self,
        message_ids: Iterable[int],
        delivery: DeliveryRecord | None = ...,
        *,
        session_id: str | None = ...,
        fence: Fence | None = ...,
    ) -> None: ...
    async def unanswered(self, session_id: str | None = ...) -> list[dict]: ...
    async def claimed(self, session_id: str) -> tuple[list[dict], list[DeliveryRecord]]: ...
    async def backlog(self) -> tuple[int, float | None]: ...
    async def mark_pending(self, session_ids: Iterable[str]) -> int: ...
    async def begin_streamed_delivery(
        self,
        delivery: DeliveryRecord,
        *,
        session_id: str,
        sent_ids: list[str],
    ) -> None: ...
    async def post_streamed_message(self, delivery: DeliveryRecord, *, session_id: str, text: str) -> None: ...
    async def pending_deliveries(self, session_id: str | None = ...) -> list[DeliveryRecord]: ...
    async def update_delivery(
        self,
        delivery_id: str,
        *,
        sent_ids: list[str],
        status: str,
        error: str | None = ...,
        handback: Handback | None = ...,
    ) -> bool: ...
    async def get_delivery(self, delivery_id: str) -> DeliveryRecord | None: ...
    async def list_deliveries(self, session_id: str) -> list[DeliveryRecord]: ...
    async def counts(self) -> dict: ...


class AsyncDeadLetters:
    """DeadLetters's marked methods (``adb.dead_letters``), each a coroutine."""

    async def add(
        self,
        *,
        platform: str,
        event_id: str | None,
        payload: str,
        message: str | None,
        error: str,
        attempts: int = ...,
    ) -> int: ...
    async def get(self, dead_letter_id: int) -> dict | None: ...
    async def due_for_retry(self, limit: int = ...) -> list[dict]: ...
    async def set_status(
        self,
        dead_letter_id: int,
        status: str,
        *,
        only_from: tuple[str, ...] | None = ...,
        error: str | None = ...,
        failed_attempt: bool = ...,
    ) -> bool: ...
    async def count(self, status: str = ...) -> int: ...
    async def list(self, *, status: str | None = ..., limit: int = ...) -> list[dict]: ...


class AsyncChatPrefs:
    """ChatPrefs's marked methods (``adb.prefs``), each a coroutine."""

    async def set(self, session_key: str, name: str, value: str, *, now: float) -> None: ...
    async def get(self, session_key: str, name: str) -> str | None: ...


class AsyncFacts:
    """Facts's marked methods (``adb.facts``), each a coroutine."""

    async def add(
        self,
        agent: str,
        user_scope: str,
        content: str,
        entities: list[str],
        *,
        session_id: str | None,
        trust: float,
        now: float,
        hrr: bytes | None,
    ) -> int: ...
    async def add_many(self, agent: str, user_scope: str, rows: list[dict], *, now: float) -> list[int]: ...
    async def confirm(self, fact_id: int, *, now: float, trust_step: float) -> dict | None: ...
    async def contradict(self, fact_id: int, *, factor: float, superseded_by: int | None = ...) -> dict | None: ...
    async def delete(self, agent: str, user_scope: str, fact_id: int) -> bool: ...
    async def claim_extraction(self, session_id: str, *, now: float) -> bool: ...
    async def finish_extraction(self, session_id: str, *, added: int, confirmed: int) -> None: ...
    async def release_extraction(self, session_id: str) -> None: ...
    async def extraction(self, session_id: str) -> dict | None: ...
    async def sessions_awaiting(
        self,
        *,
        since: float,
        now: float,
        min_messages: int = ...,
        limit: int = ...,
    ) -> list[str]: ...
    async def set_prefetch(self, session_key: str, on: bool, *, now: float) -> None: ...
    async def prefetch_enabled(self, session_key: str) -> bool | None: ...
    async def prefetch_candidates(
        self,
        session_key: str,
        default_on: bool,
        agent: str,
        user_scope: str,
        terms: list[str],
        *,
        limit: int,
    ) -> list[dict]: ...
    async def get(self, fact_id: int) -> dict | None: ...
    async def candidates(
        self,
        agent: str,
        user_scope: str,
        terms: list[str],
        *,
        limit: int,
        include_superseded: bool = ...,
        window: int = ...,
    ) -> list[dict]: ...
    async def count(self, agent: str, user_scope: str) -> int: ...
    async def list(
        self,
        agent: str,
        user_scope: str,
        *,
        limit: int = ...,
        include_superseded: bool = ...,
    ) -> list[dict]: ...


class AsyncCronJobs:
    """CronJobs's marked methods (``adb.cron``), each a coroutine."""

    async def add_job(self, job: dict, *, source: str, now: float, next_run_at: float | None) -> dict: ...
    async def get_job(self, job_id: str) -> dict | None: ...
    async def list_jobs(self) -> list[dict]: ...
    async def update_job(self, job_id: str, changes: dict, *, now: float, next_run_at: Any = ...) -> dict: ...
    async def set_paused(self, job_id: str, paused: bool, *, now: float, next_run_at: Any = ...) -> dict: ...
    async def remove_job(self, job_id: str) -> bool: ...
    async def sync_config_jobs(self, jobs: list[dict], *, now: float, remove_missing: bool = ...) -> dict: ...
    async def begin_run(
        self,
        job_id: str,
        *,
        holder: str,
        now: float,
        lease_seconds: float,
        trigger: str,
        scheduled_at: float | None,
        deliver: str | None,
        expect_next_run_at: Any = ...,
        next_run_at: Any = ...,
        note: str | None = ...,
    ) -> dict: ...
    async def skip_run(
        self,
        job_id: str,
        *,
        now: float,
        scheduled_at: float | None,
        reason: str,
        expect_next_run_at: float | None,
        next_run_at: float | None,
    ) -> dict | None: ...
    async def renew_lease(self, job_id: str, holder: str, *, now: float, lease_seconds: float) -> bool: ...
    async def get_lease(self, job_id: str) -> dict | None: ...
    async def set_run_session(self, run_id: int, session_id: str) -> None: ...
    async def finish_run(
        self,
        run_id: int,
        *,
        holder: str,
        now: float,
        status: str,
        session_id: str | None = ...,
        output: str | None = ...,
        error: str | None = ...,
        delivery: str | None = ...,
        next_delivery_at: float | None = ...,
    ) -> dict | None: ...
    async def get_run(self, run_id: int) -> dict | None: ...
    async def list_runs(self, job_id: str | None = ..., limit: int = ...) -> list[dict]: ...
    async def reap_runs(self, *, now: float) -> list[dict]: ...
    async def due_deliveries(self, *, now: float, limit: int = ...) -> list[dict]: ...
    async def claim_delivery(self, run_id: int, *, now: float, hold_seconds: float) -> dict | None: ...
    async def record_delivery(
        self,
        run_id: int,
        *,
        now: float,
        ok: bool,
        error: str | None = ...,
        retry_at: float | None = ...,
    ) -> dict | None: ...


class AsyncUsageLedger:
    """UsageLedger's marked methods (``adb.usage``), each a coroutine."""

    async def record_call(self, row: dict) -> int: ...
    async def record_calls(self, rows: list[dict]) -> list[int]: ...
    async def calls(self, since: float = ..., limit: int = ...) -> list[dict]: ...
    async def report(
        self,
        since: float,
        by: str = ...,
        *,
        platform: str | None = ...,
        user_id: str | None = ...,
    ) -> list[dict]: ...
    async def summary(
        self,
        since: float,
        by: str = ...,
        *,
        limit: int | None = ...,
        platform: str | None = ...,
        user_id: str | None = ...,
    ) -> dict: ...
    async def called_models(self, since: float = ...) -> dict[str, float]: ...
    async def reprice(
        self,
        model: str,
        price: dict[str, float] | None,
        since: float = ...,
        until: float | None = ...,
    ) -> int: ...
    async def prune(self, before: float, limit: int | None = ...) -> int: ...


class AsyncPairing:
    """Pairing's marked methods (``adb.pairing``), each a coroutine."""

    async def is_approved(self, platform: str, user_id: str) -> bool: ...
    async def request(
        self,
        platform: str,
        user_id: str,
        user_name: str | None,
        code: str,
        *,
        now: float,
        ttl: float,
        max_pending: int,
        waiting: str | None = ...,
    ) -> dict | None: ...
    async def welcomes(self) -> list[dict]: ...
    async def welcomed(self, platform: str, user_id: str) -> bool: ...
    async def approve(self, platform: str, code: str, now: float | None = ...) -> dict: ...
    async def revoke(self, platform: str, user_id: str) -> bool: ...
    async def list(self, now: float | None = ...) -> dict: ...


class AsyncTransfer:
    """Transfer's marked methods (``adb.transfer``), each a coroutine."""

    async def export(self, session_id: str) -> dict | None: ...
    async def export_all(self, source: str | None = ...) -> list[dict]: ...
    async def write_export(self, handle: IO[str], source: str | None = ..., session_id: str | None = ...) -> int: ...
    async def import_sessions(
        self,
        records: Iterable[tuple[int, dict]],
        *,
        chunk_messages: int = ...,
        taken_title_suffix: str | None = ...,
    ) -> dict: ...
    async def stats(self) -> dict: ...


class AsyncStorage:
    """Storage's marked methods (``adb.storage``), each a coroutine."""

    async def report(self, largest: int = ...) -> StorageReport: ...


class AsyncUpkeep:
    """Upkeep's marked methods (``adb.upkeep``), each a coroutine."""

    async def store_size(self) -> StoreSize: ...
    async def expired_sessions(self, cutoff: float) -> list[tuple[str, int]]: ...
    async def prune_step(
        self,
        session_ids: list[str],
        cutoff: float,
        max_bytes: int,
        *,
        gives_way: bool = ...,
    ) -> tuple[PruneStep, Timed]: ...
    async def fts_segments(self, table: str) -> list[int]: ...
    async def merge_step(
        self,
        table: str,
        pages: int,
        segments: list[int] | None = ...,
        start: bool = ...,
        *,
        gives_way: bool = ...,
    ) -> tuple[MergeStep, Timed]: ...
    async def automerge(self, on: bool) -> Timed: ...
    async def vacuum_step(self, pages: int, *, gives_way: bool = ...) -> tuple[int, Timed]: ...
    async def record(self, report: dict) -> None: ...
    async def last(self) -> dict | None: ...


class AsyncToolJournal:
    """ToolJournal's marked methods (``adb.tool_journal``), each a coroutine."""

    async def save(
        self,
        message_id: int,
        session_id: str,
        produced: str,
        running: str | None,
        *,
        now: float,
    ) -> None: ...
    async def newest(self, message_ids: list[int]) -> dict | None: ...
    async def running(self, session_id: str) -> list[str]: ...
    async def drop(self, message_ids: list[int]) -> None: ...


class AsyncVoiceMessages:
    """VoiceMessages's marked methods (``adb.voice``), each a coroutine."""

    async def set_text(self, message_id: int, text: str) -> bool: ...


class AsyncBudgets:
    """Budgets's marked methods (``adb.budgets``), each a coroutine."""

    async def record_calls(
        self,
        rows: list[dict],
        spends: list[tuple[str, str, float, int]],
        released: list[int] | None = ...,
    ) -> list[int]: ...
    async def admit(
        self,
        keys: list[tuple[str, str]],
        judge: Callable[..., Any],
        *,
        now: float,
    ) -> tuple[dict[tuple[str, str], tuple[float, int]], dict[tuple[str, str], tuple[float, int]], list[int]]: ...
    async def release(self, ids: list[int]) -> None: ...
    async def resets(self, since: float) -> list[tuple[str, str, float]]: ...
    async def spent(self, scopes: list[str], periods: list[str]) -> dict[tuple[str, str], tuple[float, int]]: ...
    async def spent_in(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, int]]: ...
    async def ledger_spent(
        self,
        filters: list[tuple[str | None, str | None, str | None]],
        since: float,
        until: float,
    ) -> tuple[float, int]: ...
    async def reset(self, scope: str, period: str, *, now: float | None = ...) -> bool: ...
    async def set_rule(
        self,
        name: str,
        scope: str,
        period: str,
        kind: str,
        amount: float | None,
        *,
        now: float,
    ) -> None: ...
    async def rules(self, since: float = ...) -> list[dict]: ...
    async def changes(
        self,
        rules_since: float,
        resets_since: float,
    ) -> tuple[list[dict], list[tuple[str, str, float]]]: ...
    async def claim_notice(self, rule: str, period: str, level: str, target: str, *, now: float) -> bool: ...
    async def prune(self, before_day: str, before_month: str) -> int: ...


class AsyncApprovals:
    """Approvals's marked methods (``adb.approvals``), each a coroutine."""

    async def add(self, row: dict) -> None: ...
    async def get(self, approval_id: str) -> dict | None: ...
    async def pending_in_chat(self, platform: str, chat_id: str) -> list[dict]: ...
    async def expired(self, now: float, limit: int = ...) -> list[dict]: ...
    async def next_expiry(self) -> float | None: ...
    async def approved_once(self, session_id: str, tool: str) -> bool: ...
    async def for_session(self, session_id: str) -> list[dict]: ...
    async def decide(self, approval_id: str, status: str, by: str | None, *, now: float) -> dict | None: ...
    async def deny(self, approval_id: str, status: str, by: str | None, content: str, *, now: float) -> int | None: ...
    async def interrupted(self) -> list[dict]: ...
    async def store_result(
        self,
        approval_id: str,
        session_id: str,
        content: str,
        *,
        from_status: str,
        to_status: str,
    ) -> int | None: ...


class AsyncQuestions:
    """Questions's marked methods (``adb.questions``), each a coroutine."""

    async def add(self, row: dict) -> None: ...
    async def get(self, question_id: str) -> dict | None: ...
    async def pending(self) -> list[dict]: ...
    async def of_round(self, round_id: str) -> list[dict]: ...
    async def rounds_of_call(self, session_id: str, call_id: str) -> list[str]: ...
    async def resend(self, round_id: str, *, now: float) -> bool: ...
    async def close(
        self,
        question_id: str,
        status: str,
        *,
        answer: str | None = ...,
        by: str | None = ...,
        now: float,
    ) -> bool: ...


class AsyncReplays:
    """Replays's marked methods (``adb.replays``), each a coroutine."""

    async def claim(self, scope: str, signature: str, *, keep_until: float, held_until: float, now: float) -> Claim: ...
    async def stored(self, scope: str, signature: str) -> None: ...
    async def release(self, scope: str, signature: str) -> None: ...


class AsyncReceipts:
    """Receipts's marked methods (``adb.receipts``), each a coroutine."""

    async def record(
        self,
        platform: str,
        message_id: str,
        status: str,
        error: str | None = ...,
        at: float | None = ...,
    ) -> bool: ...
    async def of(self, platform: str, message_ids: Iterable[str]) -> dict[str, dict]: ...
    async def deliveries(
        self,
        *,
        platform: str | None = ...,
        session_id: str | None = ...,
        limit: int = ...,
    ) -> list[dict]: ...


class AsyncMedia:
    """Media's marked methods (``adb.media``), each a coroutine."""

    async def attach(self, message_id: int, items: list[dict]) -> int: ...
    async def set_text(self, sha256: str, text: str) -> int: ...
    async def set_note(self, sha256: str, note: str) -> int: ...
    async def of_lineage(self, session_id: str) -> list[dict]: ...
    async def of_message(self, message_id: int) -> list[dict]: ...
    async def of_sessions(self, session_ids: list[str]) -> set[str]: ...
    async def referenced(self) -> set[str]: ...
    async def search(self, query: str, session_ids: list[str] | None = ..., limit: int = ...) -> list[dict]: ...
    async def stats(self) -> dict: ...


class AsyncA2aTasks:
    """A2aTasks's marked methods (``adb.a2a``), each a coroutine."""

    async def add(self, row: dict) -> bool: ...
    async def forget(self, task_id: str) -> None: ...
    async def get(self, task_id: str) -> dict | None: ...
    async def in_context(self, caller: str, context_id: str, limit: int = ...) -> list[dict]: ...
    async def end(
        self,
        task_id: str,
        state: str,
        *,
        answer: str | None = ...,
        error: str | None = ...,
        now: float,
    ) -> bool: ...
    async def working_before(self, session_key: str, created_at: float) -> list[str]: ...
    async def due_pushes(self, now: float, limit: int = ...) -> list[dict]: ...
    async def take_push(self, task_id: str, due: float, retry_at: float) -> bool: ...
    async def settle_push(self, task_id: str, retry_at: float | None, error: str | None = ...) -> None: ...


class AsyncMcpAuthStore:
    """McpAuthStore's marked methods (``adb.mcp_auth``), each a coroutine."""

    async def put(
        self,
        server: str,
        principal: str,
        kind: str,
        data: str,
        *,
        expires_at: float | None = ...,
        now: float,
    ) -> None: ...
    async def get(self, server: str, principal: str, kind: str) -> str | None: ...
    async def drop(self, server: str, principal: str | None, kind: str = ...) -> int: ...
    async def principals(self, server: str) -> list[str]: ...
    async def add_flow(self, row: dict) -> None: ...
    async def take_flow(self, state_hash: str, *, now: float) -> dict | None: ...


class AsyncTurns:
    """Turns's marked methods (``adb.turns``), each a coroutine."""

    async def store_then_context(
        self,
        session_key: str,
        content: str | None,
        query: ContextQuery,
        *,
        platform_message_id: str | None,
        keep: Callable[[dict], bool] = ...,
        inbox: dict | None = ...,
        role: str = ...,
        **fields: Any,
    ) -> tuple[dict | None, Appended | None, TurnContext | None]: ...
    async def context(self, query: ContextQuery) -> TurnContext: ...


class AsyncFace:
    """SessionDB's marked methods, each a coroutine with the same parameters and result, and its
    repositories, whose marked methods are coroutines too."""

    sessions: AsyncSessions
    messages: AsyncMessages
    titles: AsyncTitles
    routes: AsyncRoutes
    compression: AsyncCompression
    search: AsyncSearch
    recall: AsyncRecall
    recovery: AsyncRecovery
    dead_letters: AsyncDeadLetters
    prefs: AsyncChatPrefs
    facts: AsyncFacts
    cron: AsyncCronJobs
    usage: AsyncUsageLedger
    pairing: AsyncPairing
    transfer: AsyncTransfer
    storage: AsyncStorage
    upkeep: AsyncUpkeep
    tool_journal: AsyncToolJournal
    voice: AsyncVoiceMessages
    budgets: AsyncBudgets
    approvals: AsyncApprovals
    questions: AsyncQuestions
    replays: AsyncReplays
    receipts: AsyncReceipts
    media: AsyncMedia
    a2a: AsyncA2aTasks
    mcp_auth: AsyncMcpAuthStore
    turns: AsyncTurns

    async def checkpoint_aside(self, mode: str = ...) -> tuple[int, int, int]: ...
