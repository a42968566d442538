"""PNG plot of total tokens/s against concurrency, one line per run."""

from __future__ import annotations

from pathlib import Path

from onebit.bench.runfile import summaries


def plot_runs(runs: list[dict], path: Path, title: str = "1bit bench") -> Path:
    """Draw total decode tokens/s by concurrency for each run (labelled) and save a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and in tests
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    levels: set[int] = set()
    for run in runs:
        points = summaries(run)
        xs = [s["concurrency"] for s in points]
        levels.update(xs)
        ax.plot(xs, [s["total_tok_s"] for s in points], marker="o", label=run["label"])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("total decode tokens/s")
    ax.set_title(title)
    ax.set_xticks(sorted(levels))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
