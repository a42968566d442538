"""Prometheus metrics with the `onebit:` prefix, in the server's own registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from onebit.api.loop_histogram import LoopHistogram
from onebit.api.metric_table import labelled_families
from onebit.api.user_metrics import UserCollector

if TYPE_CHECKING:
    from onebit.engine.outputs import EngineStats
    from onebit.router import Route

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class _SpecFamilies:
    """Speculative decoding counters, labelled by backend (and draft position, 1 = first draft)."""

    def __init__(self):
        self.drafted = CounterMetricFamily("onebit:spec_decode_num_draft_tokens", "Draft tokens verified",
                                           labels=["backend"])
        self.accepted = CounterMetricFamily("onebit:spec_decode_num_accepted_tokens",
                                            "Draft tokens the model kept", labels=["backend"])
        self.drafted_pos = CounterMetricFamily("onebit:spec_decode_num_draft_tokens_per_pos",
                                               "Draft tokens verified at this position of their draft",
                                               labels=["backend", "position"])
        self.accepted_pos = CounterMetricFamily("onebit:spec_decode_num_accepted_tokens_per_pos",
                                                "Draft tokens kept at this position of their draft",
                                                labels=["backend", "position"])
        self.steps = CounterMetricFamily("onebit:num_decode_steps", "Engine steps that decoded",
                                         labels=["backend"])
        self.draft_steps = CounterMetricFamily("onebit:spec_decode_num_draft_steps",
                                               "Decode steps that verified drafts", labels=["backend"])

    def add(self, backend: str, spec) -> None:
        """Add one backend's SpecStats."""
        self.drafted.add_metric([backend], spec.draft_tokens)
        self.accepted.add_metric([backend], spec.accepted_tokens)
        for i, (drafted, accepted) in enumerate(zip(spec.drafted_at, spec.accepted_at), start=1):
            self.drafted_pos.add_metric([backend, str(i)], drafted)
            self.accepted_pos.add_metric([backend, str(i)], accepted)
        self.steps.add_metric([backend], spec.decode_steps)
        self.draft_steps.add_metric([backend], spec.draft_steps)

    def families(self) -> tuple:
        """Every family, for the collector to yield."""
        return (self.drafted, self.accepted, self.drafted_pos, self.accepted_pos, self.steps, self.draft_steps)


class _BackendRow(NamedTuple):
    """One backend at scrape time: its route and the engine stats it reported."""

    route: Route
    stats: EngineStats


_BACKEND_COLUMNS = (
    (GaugeMetricFamily, "onebit:num_requests_running", "Requests in the engine's running batch",
     lambda row: row.stats.num_running),
    (GaugeMetricFamily, "onebit:num_requests_waiting", "Requests waiting inside the engine",
     lambda row: row.stats.num_waiting),
    (GaugeMetricFamily, "onebit:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)",
     lambda row: row.stats.kv_usage),
    (GaugeMetricFamily, "onebit:kv_cache_blocks", "KV cache blocks in the pool", lambda row: row.stats.num_kv_blocks),
    (CounterMetricFamily, "onebit:num_preemptions", "Sequences preempted for lack of KV blocks",
     lambda row: row.stats.num_preemptions),
    (GaugeMetricFamily, "onebit:router_in_flight", "Slots reserved by the router", lambda row: row.route.in_flight),
    (GaugeMetricFamily, "onebit:backend_up", "1 when the backend serves",
     lambda row: 1.0 if row.route.backend.state == "ready" else 0.0),
)


class _BackendCollector:
    """Reads the router's per-backend engine stats at scrape time."""

    def __init__(self, router):
        self.router = router

    def collect(self):
        """Yield one family per engine-side number, labelled by backend."""
        rows = [(route.name, _BackendRow(route, route.backend.stats())) for route in self.router.routes]
        spec = _SpecFamilies()
        for name, row in rows:
            if row.stats.spec is not None:
                spec.add(name, row.stats.spec)
        queued = GaugeMetricFamily("onebit:num_requests_queued", "Requests waiting in the router for a slot")
        queued.add_metric([], self.router.queue_size)
        yield from (*labelled_families("backend", _BACKEND_COLUMNS, rows), queued, *spec.families())


class Metrics:
    """The request-side metrics the API records, plus the backend collector."""

    def __init__(self, router):
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter("onebit:prompt_tokens", "Prompt tokens processed", ["backend"], registry=r)
        self.generation_tokens = Counter("onebit:generation_tokens", "Tokens generated", ["backend"], registry=r)
        self.requests = Counter("onebit:request_success", "Finished requests by finish reason",
                                ["backend", "finished_reason"], registry=r)
        self.ttft = Histogram("onebit:time_to_first_token_seconds", "Time to first token", ["backend"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = LoopHistogram("onebit:inter_token_latency_seconds", "Time between streamed token batches",
                                 "backend", _LATENCY_BUCKETS, r)  # one observation per streamed event
        self.e2e = Histogram("onebit:e2e_request_latency_seconds", "Request latency, arrival to last token",
                             ["backend"], buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_BackendCollector(router))
        r.register(UserCollector(router))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
