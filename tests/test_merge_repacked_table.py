"""tools/merge_repacked_table.py: a sweep's winner replaces the shipped pick only when it beat that
pick, timed in the same sweep, by the margin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from onebit.kernels import triton_gguf_repacked as tr

ROOT = Path(__file__).resolve().parents[1]


def _record(qtype: str, rows: int, product: str, us: dict[str, float], error: float = 0.01) -> dict:
    return {"product": product, "qtype": qtype, "rows": rows, "bf16_us": 30.0, "us": us,
            "rel_err": {label: error for label in us}}


def test_a_winner_is_merged_only_past_the_margin_and_only_against_the_shipped_config(tmp_path):
    fields = {name: tr.CONFIGS[name]._asdict() for name in ("fma-n64-g2", "fma-n16-g2", "int-n64-g1-p256")}
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"Q4_K": {"1": fields["fma-n64-g2"], "64": fields["int-n64-g1-p256"]},
                                 "Q8_0": {"1": fields["fma-n64-g2"]}, "Q6_K": {"1": fields["fma-n16-g2"]}}))
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    records = [
        _record("Q4_K", 1, "qkv", {"fma-n64-g2": 10.0, "i8-n32-g4-s1": 8.0}),  # 1.25x on both products
        _record("Q4_K", 1, "head", {"fma-n64-g2": 20.0, "i8-n32-g4-s1": 16.0}),
        _record("Q8_0", 1, "qkv", {"fma-n64-g2": 10.0, "i8-n32-g4-s1": 9.5}),  # 1.05x: under the margin
        _record("Q6_K", 1, "qkv", {"fma-n64-g2": 10.0}),  # the shipped fma-n16-g2 was not timed
        _record("Q4_K", 64, "qkv", {"int-n64-g1-p256": 20.0, "dot-n64-g1": 10.0}, error=0.05),  # fast, wrong
    ]
    (sweep / "gguf_repacked.json").write_text(json.dumps({"records": records}))
    before = table.read_text()
    dry = subprocess.run([sys.executable, "tools/merge_repacked_table.py", str(sweep), "--table", str(table)],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert "1 pick(s) would be merged" in dry.stdout and table.read_text() == before  # without --write
    run = subprocess.run([sys.executable, "tools/merge_repacked_table.py", str(sweep), "--table", str(table),
                          "--write"], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = {" ".join(line.split(" | ")[:2]).strip("| "): line for line in run.stdout.splitlines()
             if line.startswith("| Q")}
    assert "| 1.25x | yes |" in lines["Q4_K 1"] and "| 1.05x | no |" in lines["Q8_0 1"]
    assert "not in this sweep" in lines["Q6_K 1"] and "wrote 1 pick(s)" in run.stdout
    assert lines["Q4_K 64"].endswith(
        "| dot-n64-g1 | 2.00x | no | gain 2.00x >= 1.15x; relative error 5.0e-02 > 3.0e-02 |")
    merged = json.loads(table.read_text())
    assert merged["Q4_K"]["1"] == tr.CONFIGS["i8-n32-g4-s1"]._asdict()
    assert merged["Q4_K"]["64"] == fields["int-n64-g1-p256"]  # counts the sweep did not time stay
    assert merged["Q8_0"]["1"] == fields["fma-n64-g2"] and merged["Q6_K"]["1"] == fields["fma-n16-g2"]


def test_the_sweep_gives_a_product_shape_its_own_pick_only_past_the_margin():
    """bench/gpu_gguf_repacked.py's `shape_picks`: at a shape where the fastest config beats the type's
    pick by 5% or more it becomes that shape's pick ("QTYPE NxK"); a faster config that is wrong
    (relative error past MAX_PICK_ERROR) is never picked; a shape whose type pick was not timed, or
    whose best is within the margin, keeps the type's."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_gguf_repacked as sweep
    finally:
        sys.path.pop(0)
    configs = {name: tr.CONFIGS[name] for name in ("int-n64-g1-p256", "f16s-n128-p256", "f16s-n128")}
    table = {"Q4_K": {"64": configs["int-n64-g1-p256"]._asdict()}}

    def record(n: int, k: int, us: dict, wrong: tuple = ()) -> dict:
        return {"qtype": "Q4_K", "rows": 64, "n": n, "k": k, "us": us,
                "rel_err": {label: 0.05 if label in wrong else 2e-3 for label in us}}

    records = [record(24576, 4096, {"int-n64-g1-p256": 86.0, "f16s-n128-p256": 80.0, "f16s-n128": 72.0}),
               record(4096, 4096, {"int-n64-g1-p256": 18.0, "f16s-n128": 17.5}),  # 1.03x: under the margin
               record(6144, 4096, {"int-n64-g1-p256": 30.0, "f16s-n128": 20.0}, wrong=("f16s-n128",)),
               record(4096, 12288, {"f16s-n128": 40.0})]  # the type's pick not timed here
    shapes, notes = sweep.shape_picks(records, configs, table)
    assert shapes == {"Q4_K 24576x4096": {"64": configs["f16s-n128"]._asdict()}}
    assert len(notes) == 1 and "f16s-n128 (1.19x over int-n64-g1-p256)" in notes[0]


def test_shapes_get_their_own_picks_at_every_count_timed_when_one_wins(tmp_path):
    """--shapes: o (4096x4096) wins at 16 rows by 1.25x over its own key's pick, so its key names a
    config at 8, 16 and 64 (the rows timed); down (4096x12288) wins nowhere past the margin and keeps
    no new key; qkv's current pick at 64 rows was not timed, so it is left alone."""
    names = ("int-n64-g1-p256", "f16s-n128", "f16s-n64-p512")
    fields = {name: tr.CONFIGS[name]._asdict() for name in names}
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"Q4_K": {"8": fields["f16s-n128"], "64": fields["f16s-n128"]},
                                 "Q4_K 4096x4096": {"16": fields["int-n64-g1-p256"]}}))
    sweep = tmp_path / "sweep"
    sweep.mkdir()

    def record(n, k, rows, us):
        return {**_record("Q4_K", rows, f"{n}x{k}", us), "n": n, "k": k}

    records = [record(4096, 4096, 8, {"f16s-n128": 10.0, "f16s-n64-p512": 9.8}),
               record(4096, 4096, 16, {"int-n64-g1-p256": 12.5, "f16s-n64-p512": 10.0}),
               record(4096, 4096, 64, {"f16s-n128": 20.0, "f16s-n64-p512": 19.0}),
               record(4096, 12288, 8, {"f16s-n128": 30.0, "f16s-n64-p512": 29.0}),
               record(6144, 4096, 64, {"f16s-n64-p512": 5.0})]
    (sweep / "gguf_repacked.json").write_text(json.dumps({"records": records}))
    run = subprocess.run([sys.executable, "tools/merge_repacked_table.py", str(sweep), "--table", str(table),
                          "--min-gain", "1.15", "--shapes", "--write"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    merged = json.loads(table.read_text())
    assert merged["Q4_K 4096x4096"] == {"8": fields["f16s-n128"], "16": fields["f16s-n64-p512"],
                                        "64": fields["f16s-n128"]}
    assert "Q4_K 4096x12288" not in merged and "Q4_K 6144x4096" not in merged
    assert merged["Q4_K"] == {"8": fields["f16s-n128"], "64": fields["f16s-n128"]}  # no type pick won
    assert "| Q4_K 4096x4096 | 8: f16s-n128, 16: f16s-n64-p512, 64: f16s-n128 |" in run.stdout
