"""Per-user Prometheus families, read from the router's UserBook at scrape time (names, never texts)."""

from __future__ import annotations

from operator import itemgetter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from onebit.api.metric_table import labelled_families

_USER_COLUMNS = (
    (CounterMetricFamily, "onebit:user_tokens_served", "Tokens served to the user (prompt + output)",
     itemgetter("tokens_served")),
    (CounterMetricFamily, "onebit:user_queue_wait_seconds", "Seconds the user's requests waited for a slot",
     itemgetter("wait_seconds")),
    (CounterMetricFamily, "onebit:user_requests", "Slots the user's requests took", itemgetter("requests")),
    (GaugeMetricFamily, "onebit:user_requests_running", "The user's requests holding a slot", itemgetter("running")),
    (GaugeMetricFamily, "onebit:user_requests_waiting", "The user's requests waiting for a slot",
     itemgetter("waiting")),
)


class UserCollector:
    """Tokens served, seconds waited, and requests running and waiting, labelled by user."""

    def __init__(self, router):
        self.router = router

    def collect(self):
        """Yield the per-user families."""
        rows = ((row["user"], row) for row in self.router.users.snapshot())
        yield from labelled_families("user", _USER_COLUMNS, rows)
