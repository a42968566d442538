"""The error every part of the online benchmark raises when the benchmark itself cannot run."""


class BenchError(RuntimeError):
    """The benchmark cannot run (server unreachable, no model, warm-up failed, client processes dead)."""
