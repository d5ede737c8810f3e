"""`GET /metrics`: the engine's figures in the Prometheus text format.

A custom collector reads a stats snapshot (`protocol/stats.py`, the body of `GET /v1/stats`) at
scrape time, so the hot path keeps its own cheap counters, nothing here is updated per token,
and a scrape says what `/v1/stats` says. The two latency histograms are fed from the snapshot's
recent request records, each record once, when a scrape sees it (requests that fall off the
engine's ring between two scrapes are missed; the ring holds 50 by default).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import get_args

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from mlxlaunch.protocol.stats import ModelState, RecentRequest, RequestCounters, StatsSnapshot

ReadStats = Callable[[], StatsSnapshot | None]

PREFIX = "mlxlaunch"
MODEL_STATES: tuple[ModelState, ...] = get_args(ModelState)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
# Counters with their own metric; any other `requests_<x>` counter becomes outcome="<x>".
_TOKEN_COUNTERS = {
    "prompt_tokens": ("prompt_tokens", "Prompt tokens of admitted requests."),
    "cached_tokens": ("cached_prompt_tokens", "Prompt tokens served from the prefix cache."),
    "generated_tokens": ("generated_tokens", "Tokens generated."),
    "drafted_tokens": ("drafted_tokens", "Tokens drafted by speculative decoding."),
    "accepted_tokens": ("accepted_tokens", "Drafted tokens accepted."),
}
_SEEN_LIMIT = 4096


class Histogram:
    """Cumulative bucket counts of one latency, observed once per request."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        index = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    def family(self) -> HistogramMetricFamily:
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=cumulative, sum_value=self.total
        )


class EngineCollector(Collector):
    """Prometheus collector over stats snapshots; safe to scrape from several threads.

    Args:
        read: the current snapshot (None: the engine reports no stats; all figures read 0).
    """

    def __init__(self, read: ReadStats) -> None:
        self.read = read
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time from submission to the first generated token.",
            TTFT_BUCKETS,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Mean time between two generated tokens of a request.",
            ITL_BUCKETS,
        )

    def collect(self) -> Iterable[Metric]:
        snap = self.read() or StatsSnapshot()
        with self._lock:
            self._absorb(snap.recent)
            histograms = [self.ttft.family(), self.itl.family()]
        yield from _counters(snap.counters)
        yield from _gauges(snap)
        yield from _per_model(snap.models)
        yield from histograms

    def _absorb(self, records: Iterable[RecentRequest]) -> None:
        for record in records:
            if not record.request_id or record.request_id in self._seen:
                continue
            self._seen[record.request_id] = None
            if len(self._seen) > _SEEN_LIMIT:
                self._seen.popitem(last=False)
            if record.output_tokens < 1:
                continue  # refused or failed before a token: no latency to speak of
            if record.ttft_s > 0:
                self.ttft.observe(record.ttft_s)
            if record.decode_tps > 0:
                self.itl.observe(1.0 / record.decode_tps)


def _counters(counters: RequestCounters) -> Iterator[Metric]:
    outcomes = CounterMetricFamily(f"{PREFIX}_requests", "Requests by outcome.", labels=["outcome"])
    for name, value in counters.model_dump().items():
        if name == "requests_admitted":
            yield CounterMetricFamily(
                f"{PREFIX}_requests_admitted", "Requests admitted to the engine.", value=value
            )
        elif name.startswith("requests_"):
            outcomes.add_metric([name.removeprefix("requests_")], value)
        elif name in _TOKEN_COUNTERS:
            metric, doc = _TOKEN_COUNTERS[name]
            yield CounterMetricFamily(f"{PREFIX}_{metric}", doc, value=value)
        else:  # any other counter: exported under its own name
            yield CounterMetricFamily(f"{PREFIX}_{name}", f"Engine counter {name}.", value=value)
    yield outcomes


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=float(value))


def _gauges(snap: StatsSnapshot) -> Iterator[Metric]:
    yield _gauge("queue_depth", "Requests waiting for a batch slot.", snap.queue_depth)
    yield _gauge("requests_running", "Requests being prefilled or decoded.", snap.running)
    yield _gauge("prefill_tokens_per_second", "Recent prompt processing speed.", snap.prefill_tps)
    yield _gauge(
        "decode_tokens_per_second", "Recent generation speed, all sequences.", snap.decode_tps
    )
    yield _gauge("prefix_cache_bytes", "Memory held by the prefix cache.", snap.cache.bytes)
    yield _gauge("prefix_cache_disk_bytes", "Disk used by the prefix cache.", snap.cache.disk_bytes)
    yield _gauge(
        "prefix_cache_hit_ratio",
        "Share of prompt tokens served from the prefix cache.",
        snap.cache.hit_ratio,
    )
    yield _gauge("memory_active_bytes", "Accelerator memory in use.", snap.memory.active_bytes)
    yield _gauge(
        "memory_cache_bytes", "Accelerator memory held in MLX's cache.", snap.memory.cache_bytes
    )
    states = GaugeMetricFamily(
        f"{PREFIX}_model_state", "1 for the model's current load state.", labels=["state"]
    )
    for name in MODEL_STATES:
        states.add_metric([name], 1.0 if name == snap.model.state else 0.0)
    yield states
    info = GaugeMetricFamily(f"{PREFIX}_model_info", "The model being served.", labels=["model"])
    info.add_metric([snap.model.name or ""], 1.0)
    yield info


# Several models: each one's own figures, labelled by model and role (the unlabelled ones above
# are the main model's). A snapshot's field → metric name and help.
_PER_MODEL = {
    "queue_depth": ("model_queue_depth", "Requests waiting for a batch slot, per model."),
    "running": ("model_requests_running", "Requests being prefilled or decoded, per model."),
    "prefill_tps": ("model_prefill_tokens_per_second", "Recent prompt speed, per model."),
    "decode_tps": ("model_decode_tokens_per_second", "Recent generation speed, per model."),
}


def _per_model(models: Iterable[StatsSnapshot]) -> Iterator[Metric]:
    models = list(models)
    if not models:
        return
    labels = ["model", "role"]
    for field, (metric, doc) in _PER_MODEL.items():
        family = GaugeMetricFamily(f"{PREFIX}_{metric}", doc, labels=labels)
        for each in models:
            family.add_metric([each.model.name or "", each.role], float(getattr(each, field)))
        yield family
    cache = GaugeMetricFamily(
        f"{PREFIX}_model_prefix_cache_bytes", "Prefix cache memory, per model.", labels=labels
    )
    generated = CounterMetricFamily(
        f"{PREFIX}_model_generated_tokens", "Tokens generated, per model.", labels=labels
    )
    loaded = GaugeMetricFamily(
        f"{PREFIX}_model_loaded", "1 while the model is loaded, per model.", labels=labels
    )
    for each in models:
        key = [each.model.name or "", each.role]
        cache.add_metric(key, float(each.cache.bytes))
        generated.add_metric(key, float(each.counters.generated_tokens))
        loaded.add_metric(key, 1.0 if each.model.state == "loaded" else 0.0)
    yield from (cache, generated, loaded)


class MetricsRoute:
    """`GET /metrics` over one engine's snapshots, with its own registry (no process-global
    state)."""

    def __init__(self, read: ReadStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = EngineCollector(read)
        self.registry.register(self.collector)

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
