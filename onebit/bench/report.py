"""Files a bench writes: a run's JSON, Markdown and PNG, and `report` merging several runs."""

from __future__ import annotations

from pathlib import Path

from onebit.bench.plot import plot_runs
from onebit.bench.runfile import load_run, safe_name, write_run
from onebit.bench.tables import markdown_report


def write_views(runs: list[dict], out_dir: Path, stem: str, title: str) -> tuple[Path, Path]:
    """Write `stem`.md (tables) and `stem`.png (plot) for `runs` under `out_dir`; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{stem}.md"
    md.write_text(markdown_report(runs, title))
    png = plot_runs(runs, out_dir / f"{stem}.png", title)
    return md, png


def save_run(run: dict, out_dir: Path) -> list[Path]:
    """Write one run as LABEL.json, LABEL.md and LABEL.png; return the paths."""
    stem = safe_name(run["label"])
    json_path = write_run(run, out_dir / f"{stem}.json")
    return [json_path, *write_views([run], out_dir, stem, f"1bit bench: {run['label']}")]


def merge_runs(paths: list[str | Path]) -> list[dict]:
    """Load runs for one report; a label seen twice gets '#2', '#3' so each keeps its own line."""
    runs, seen = [], {}
    for path in paths:
        run = load_run(path)
        n = seen[run["label"]] = seen.get(run["label"], 0) + 1
        if n > 1:
            run["label"] = f"{run['label']}#{n}"
        runs.append(run)
    return runs


def report(paths: list[str | Path], out_dir: Path) -> list[Path]:
    """Overlay several run files: report.md (one row per label) and report.png (one line per label)."""
    runs = merge_runs(paths)
    return list(write_views(runs, out_dir, "report", "1bit bench report"))
