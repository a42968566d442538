"""Per-user Prometheus families, read from the router's UserBook at scrape time (names, never texts)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class UserCollector:
    """Tokens served, seconds waited, and requests running and waiting, labelled by user."""

    def __init__(self, router):
        self.router = router

    def collect(self):
        """Yield the per-user families."""
        served = CounterMetricFamily("onebit:user_tokens_served", "Tokens served to the user (prompt + output)",
                                     labels=["user"])
        waited = CounterMetricFamily("onebit:user_queue_wait_seconds", "Seconds the user's requests waited for a slot",
                                     labels=["user"])
        requests = CounterMetricFamily("onebit:user_requests", "Slots the user's requests took", labels=["user"])
        running = GaugeMetricFamily("onebit:user_requests_running", "The user's requests holding a slot",
                                    labels=["user"])
        waiting = GaugeMetricFamily("onebit:user_requests_waiting", "The user's requests waiting for a slot",
                                    labels=["user"])
        for row in self.router.users.snapshot():
            name = row["user"]
            served.add_metric([name], row["tokens_served"])
            waited.add_metric([name], row["wait_seconds"])
            requests.add_metric([name], row["requests"])
            running.add_metric([name], row["running"])
            waiting.add_metric([name], row["waiting"])
        yield from (served, waited, requests, running, waiting)
