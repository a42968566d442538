"""Merge a packed-GGUF sweep's winners into the shipped config table, where they win by a margin.

    python3 tools/merge_repacked_table.py SWEEP_DIR [--min-gain 1.15] [--table FILE] [--shapes] [--write]

SWEEP_DIR is a `bench/gpu_gguf_repacked.py --out` directory (its gguf_repacked.json: every config's
time at every product, type and row count). For each (type, row count) the sweep timed, the
shipped pick (`onebit/kernels/gguf_repacked_table.json`, or --table) is compared with the sweep's
best config, both timed in the same run: gain = geometric mean over the products of shipped time
/ best time. A pick whose gain reaches --min-gain replaces the shipped one (with --write; without,
the decisions are only printed). A (type, rows) whose shipped config the sweep did not time is left
alone and said so: a winner is only taken against the config it replaces, measured side by side;
nor is one whose relative error passed --max-rel-err on any product (mode "i8" rounds x to int8).

With --shapes, each product shape then gets its own picks ("QTYPE NxK") where, at some row count the
sweep timed, its fastest config beat the pick the shape takes now (its own key's, else its type's, the
type merges above included) by --min-gain: the key then names a config at every count the sweep
timed for that shape (the winner, or the pick it had), so the rows between two counts take the next
count's config as a type's rows do, and no count of the key is left to an older neighbour.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_gguf_repacked import geomean, speedup_vs_bf16  # noqa: E402


def decide(records: list[dict], shipped: dict, configs: dict, min_gain: float, max_rel_err: float) -> list[dict]:
    """One decision per (qtype, rows) in `records`: {"qtype", "rows", "shipped", "best", "gain",
    "merge", "why"}. `shipped`: {(qtype, rows): RepackedConfig}; `configs`: name -> RepackedConfig;
    a best config whose relative error passed `max_rel_err` on any product is not merged."""
    decisions = []
    for qtype, rows in sorted({(r["qtype"], r["rows"]) for r in records}):
        group = [r for r in records if r["qtype"] == qtype and r["rows"] == rows]
        timed = set.intersection(*(set(r["us"]) for r in group))  # configs timed at every product
        current = shipped.get((qtype, rows))
        names = [label for label in sorted(timed) if configs.get(label) == current]
        row = {"qtype": qtype, "rows": rows, "shipped": names[0] if names else None, "best": None,
               "gain": float("nan"), "merge": False}
        if not timed:
            decisions.append({**row, "why": "no config timed at every product"})
            continue
        best = max(timed, key=lambda label: speedup_vs_bf16(group, label))
        row["best"] = best
        if not names:
            decisions.append({**row, "why": "the shipped config was not in this sweep"})
            continue
        row["gain"] = geomean([r["us"][names[0]] / r["us"][best] for r in group])
        error = max(r["rel_err"].get(best, float("inf")) for r in group)
        row["merge"] = best != names[0] and row["gain"] >= min_gain and error <= max_rel_err
        why = "the shipped config won" if best == names[0] else \
            f"gain {row['gain']:.2f}x {'>=' if row['gain'] >= min_gain else '<'} {min_gain:.2f}x" + \
            ("" if error <= max_rel_err else f"; relative error {error:.1e} > {max_rel_err:.1e}")
        decisions.append({**row, "why": why})
    return decisions


def decide_shapes(records: list[dict], shipped: dict, configs: dict, min_gain: float,
                  max_rel_err: float) -> dict[str, dict[str, str]]:
    """{"QTYPE NxK": {rows: config name}}: the shapes where some timed row count's fastest correct config
    beat the shape's current pick (`shipped` as `table_from_json` reads it: (qtype, rows, N, K), else
    (qtype, rows)) by `min_gain`, with a name at every row count the sweep timed for the shape. A shape
    whose current pick was not timed at one of its counts is left alone."""
    out = {}
    for qtype, n, k in sorted({(r["qtype"], r["n"], r["k"]) for r in records}):
        names, won = {}, False
        for r in sorted((r for r in records if (r["qtype"], r["n"], r["k"]) == (qtype, n, k)),
                        key=lambda r: r["rows"]):
            current = shipped.get((qtype, r["rows"], n, k)) or shipped.get((qtype, r["rows"]))
            now = next((label for label in sorted(r["us"]) if configs.get(label) == current), None)
            correct = [label for label in r["us"] if r["rel_err"].get(label, float("inf")) <= max_rel_err]
            if now is None or not correct:
                names = None
                break
            best = min(correct, key=r["us"].get)
            gain = r["us"][now] / r["us"][best]
            names[str(r["rows"])] = best if gain >= min_gain else now
            won = won or gain >= min_gain
        if names and won:
            out[f"{qtype} {n}x{k}"] = names
    return out


def main() -> int:
    """Print the decisions; with --write, rewrite the table with the merged picks."""
    from onebit.kernels import triton_gguf_repacked as tr

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", type=Path, help="a bench/gpu_gguf_repacked.py --out directory")
    ap.add_argument("--min-gain", type=float, default=1.15, help="how much faster a new pick must be")
    ap.add_argument("--max-rel-err", type=float, default=0.03,
                    help="the most relative error (against float32 on the dequantized weight) a new pick may have")
    ap.add_argument("--table", type=Path, default=tr.TABLE_FILE)
    ap.add_argument("--shapes", action="store_true", help="also give product shapes their own picks")
    ap.add_argument("--write", action="store_true", help="write the merged table (else only print)")
    args = ap.parse_args()
    records = json.loads((args.sweep / "gguf_repacked.json").read_text())["records"]
    text = args.table.read_text()
    raw = json.loads(text)
    decisions = decide(records, tr.table_from_json(text), tr.CONFIGS, args.min_gain, args.max_rel_err)
    print("| type | rows | shipped | sweep's best | gain | merged | why |\n|---|---:|---|---|---:|---|---|")
    for d in decisions:
        print(f"| {d['qtype']} | {d['rows']} | {d['shipped'] or '-'} | {d['best'] or '-'} | "
              f"{'-' if math.isnan(d['gain']) else format(d['gain'], '.2f') + 'x'} | "
              f"{'yes' if d['merge'] else 'no'} | {d['why']} |")
        if d["merge"]:
            raw.setdefault(d["qtype"], {})[str(d["rows"])] = tr.CONFIGS[d["best"]]._asdict()
    merged = [d for d in decisions if d["merge"]]
    if args.shapes:
        shapes = decide_shapes(records, tr.table_from_json(json.dumps(raw)), tr.CONFIGS, args.min_gain,
                               args.max_rel_err)
        print("\n| shape | picks by rows |\n|---|---|")
        for key, names in shapes.items():
            print(f"| {key} | {', '.join(f'{rows}: {name}' for rows, name in names.items())} |")
            for rows, name in names.items():
                raw.setdefault(key, {})[rows] = tr.CONFIGS[name]._asdict()
            merged.append(key)
    if args.write and merged:
        args.table.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {len(merged)} pick(s) into {args.table}")
    elif merged:
        print(f"{len(merged)} pick(s) would be merged; --write to write them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
