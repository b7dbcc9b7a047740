"""Prometheus metrics for ``GET /metrics``: one registry per gateway instance.

Besides the gateway's own series: the standard process collector (``process_resident_memory_bytes``,
``process_open_fds``, ``process_cpu_seconds_total``, ...; Linux only, from /proc), the thread count
(``switchboard_threads``), the event loop's lag
(:func:`probe_loop_lag`, run by the daemon) and the store's size as upkeep last measured it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway import markdown, tasks
from gateway.retry import supervised_failures


class _ScrapedCounter:
    """A counter kept elsewhere in the process (a ``dict`` by label value), read at each scrape."""

    def __init__(self, name: str, documentation: str, label: str, read: Callable[[], dict[str, int]]):
        self.name, self.documentation, self.label, self.read = name, documentation, label, read

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, count in sorted(self.read().items()):
            family.add_metric([value], count)
        yield family


class _ModelEndpoints:
    """``switchboard_model_up{model}`` (1 reachable or not yet called, 0 unreachable) and
    ``switchboard_model_breaker_open{model}``: each model of the chain, read at each scrape."""

    def __init__(self, endpoints: Callable[[], dict[str, dict]]):
        self._endpoints = endpoints

    def collect(self):
        up = GaugeMetricFamily("switchboard_model_up", "Whether each model of the chain answered its last call "
                               "(0: refused, timed out or kept failing)", labels=["model"])
        breaker = GaugeMetricFamily("switchboard_model_breaker_open", "Each model of the chain left out after a "
                                    "failure (1), probed in the background until it answers", labels=["model"])
        for name, state in self._endpoints().items():
            up.add_metric([name], 0 if state["state"] in ("unreachable", "not_serving") else 1)
            breaker.add_metric([name], 1 if state["breaker"] == "open" else 0)
        yield up
        yield breaker


class _StoreSize:
    """``switchboard_store_bytes`` and ``switchboard_store_wal_bytes``: the sizes the store's upkeep cached
    (refreshed every few minutes off the event loop; a scrape never touches the database)."""

    def __init__(self, status: Callable[[], dict | None]):
        self._status = status

    def collect(self):
        status = self._status() or {}
        for name, key, doc in (("switchboard_store_bytes", "db_bytes", "Size of the store's database "
                                "(the file on SQLite, pg_database_size on PostgreSQL), at upkeep's last look"),
                               ("switchboard_store_wal_bytes", "wal_bytes", "Size of the SQLite write-ahead log "
                                "at upkeep's last look (0 on PostgreSQL)")):
            if status.get(key) is not None:  # not measured yet (the first look is just after start)
                yield GaugeMetricFamily(name, doc, value=status[key])


class _Integrity:
    """``switchboard_store_corrupt``: 1 once the store failed its integrity check (writes refused), else 0."""

    def __init__(self, status: Callable[[], dict]):
        self._status = status

    def collect(self):
        yield GaugeMetricFamily("switchboard_store_corrupt", "1 when the store's file failed its integrity check: "
                                "new writes are refused until a backup is restored (switchboard restore)",
                                value=1 if self._status()["state"] == "corrupt" else 0)


class _LastBackup:
    """``switchboard_backup_last_success_timestamp_seconds``: when the newest good automatic backup was made."""

    def __init__(self, status: Callable[[], dict]):
        self._status = status

    def collect(self):
        last = self._status()["last_good"]
        if last is not None:
            yield GaugeMetricFamily("switchboard_backup_last_success_timestamp_seconds", "When the newest automatic "
                                    "backup that passed its integrity check was made (Unix time)", value=last["at"])


LOOP_LAG_PROBE_SECONDS = 0.5  # how often the probe sleeps and wakes


async def probe_loop_lag(histogram: Histogram, *, every: float = LOOP_LAG_PROBE_SECONDS) -> None:
    """Sleep ``every`` seconds, again and again, observing how late each wake-up came: the time the event
    loop was busy with something else (a blocking call shows up here).  Runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        start = loop.time()
        await asyncio.sleep(every)
        histogram.observe(max(0.0, loop.time() - start - every))


class _Unanswered:
    """``switchboard_unanswered_sessions`` and ``switchboard_oldest_unanswered_seconds``: the daemon's
    cached read of the inbox (``gateway.runtime.backlog``), at each scrape; nothing before the first read."""

    def __init__(self, status: Callable[[], dict]):
        self._status = status

    def collect(self):
        status = self._status()
        if status["sessions"] is None:
            return
        sessions = GaugeMetricFamily("switchboard_unanswered_sessions", "Sessions with stored messages no turn "
                                     "has answered yet (the whole store's, read every few seconds)")
        sessions.add_metric([], status["sessions"])
        yield sessions
        oldest = GaugeMetricFamily("switchboard_oldest_unanswered_seconds", "Age of the oldest stored message "
                                   "no turn has answered yet (0 when none waits)")
        oldest.add_metric([], status["oldest_seconds"] or 0.0)
        yield oldest


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages_in = Counter("switchboard_messages_in", "Inbound messages accepted", ["platform"], registry=r)
        self.messages_out = Counter("switchboard_messages_out", "Replies delivered", ["platform"], registry=r)
        self.delivery_failures = Counter("switchboard_delivery_failures", "Replies the platform did not accept", ["platform"], registry=r)
        self.turn_seconds = Histogram(
            "switchboard_turn_seconds", "Agent turn latency, model included", ["platform"], registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.model_errors = Counter("switchboard_model_errors", "Model calls that failed after every retry", registry=r)
        self.model_retries = Counter("switchboard_model_retries", "Model call retries", registry=r)
        self.model_fallbacks = Counter("switchboard_model_fallbacks", "Model calls passed on to the next model "
                                       "of the chain, by the model that failed", ["model"], registry=r)
        self.budget_refusals = Counter("switchboard_budget_refusals", "Model calls refused because a budget was "
                                       "used up", ["scope"], registry=r)
        self.budget_exhausted = Counter("switchboard_budget_exhausted", "Budgets used up (once per rule and period)",
                                        ["scope"], registry=r)
        self.budget_notices = Counter("switchboard_budget_notices", "Users told that 80 % of a budget is used",
                                      ["scope"], registry=r)
        self.active_sessions = Gauge("switchboard_active_sessions", "Sessions with a turn running or queued", registry=r)
        self.dead_letters = Gauge("switchboard_dead_letters", "Events set aside after failing again and again, "
                                  "held for an operator (switchboard deadletters list)", registry=r)
        self.tool_calls = Counter("switchboard_tool_calls", "MCP tool calls, by <server>__<tool> and outcome "
                                  "(ok, error, timeout, unavailable, cancelled)", ["tool", "outcome"], registry=r)
        self.tool_seconds = Histogram("switchboard_tool_call_seconds", "MCP tool call latency, by <server>__<tool>",
                                      ["tool"], registry=r, buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60))
        self.unauthorized = Counter("switchboard_unauthorized_messages", "Messages from users not allowed", ["platform"], registry=r)
        self.loop_lag = Histogram(
            "switchboard_event_loop_lag_seconds", "How late the event loop woke a probe that sleeps "
            f"{LOOP_LAG_PROBE_SECONDS:g} s (time spent blocked or busy elsewhere)", registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.backup_failures = Counter("switchboard_backup_failures", "Automatic backups that failed (each a "
                                       "WARNING in the log; the earlier backups are kept)", registry=r)
        r.register(_ScrapedCounter("switchboard_background_task_failures", "Background tasks that ended with an "
                                   "exception (logged with a traceback)", "task", tasks.failures))
        r.register(_ScrapedCounter("switchboard_plain_text_fallbacks", "Reply parts whose formatting the platform "
                                   "refused, resent as plain text", "platform", markdown.plain_fallbacks))
        r.register(_ScrapedCounter("switchboard_supervised_restarts", "Failures of a kept-running loop (an adapter, "
                                   "a poller, a server), each followed by a restart after a backoff", "loop",
                                   supervised_failures))
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, process_cpu_seconds_total
        Gauge("switchboard_threads", "Threads in the process (the store's writer and readers, to_thread "
              "workers, the adapters' own)", registry=r).set_function(threading.active_count)

    def tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        """One MCP tool call (``gateway.tools_mcp.server.OnCall``)."""
        self.tool_calls.labels(tool, outcome).inc()
        self.tool_seconds.labels(tool).observe(seconds)

    def watch_models(self, endpoints: Callable[[], dict[str, dict]]) -> None:
        """Expose each model endpoint's state (``ModelClient.endpoints``) at each scrape."""
        self.registry.register(_ModelEndpoints(endpoints))

    def watch_store(self, status: Callable[[], dict | None]) -> None:
        """Expose the store's size and WAL size from ``status()`` (``StoreUpkeep.status``) at each scrape."""
        self.registry.register(_StoreSize(status))


    def watch_integrity(self, status: Callable[[], dict]) -> None:
        """Expose the integrity guard's verdict (``IntegrityGuard.status``) at each scrape."""
        self.registry.register(_Integrity(status))

    def watch_backups(self, status: Callable[[], dict]) -> None:
        """Expose the newest good automatic backup's time from ``status()`` (``AutoBackups.status``)."""
        self.registry.register(_LastBackup(status))

    def watch_unanswered(self, status: Callable[[], dict]) -> None:
        """Expose the unanswered backlog (``UnansweredBacklog.status``) at each scrape."""
        self.registry.register(_Unanswered(status))

    def render(self) -> bytes:
        return generate_latest(self.registry)
