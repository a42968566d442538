"""The device scripts that diagnose speed, run on the CPU at toy size: a script that breaks costs a
device call, so each must at least run to its table here."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onebit.models.default_model import default_model_dir

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_step_profile_prints_a_row_per_batch_with_its_kernel_time(tmp_path):
    out = _run(["bench/gpu_step_profile.py", "--device", "cpu", "--shape", "qwen3-tiny", "--batches", "1,2",
                "--engines", "bf16", "--steps", "2", "--prefill", "2", "--out", str(tmp_path)])
    rows = [line.split("|") for line in (tmp_path / "step_profile.md").read_text().splitlines()
            if line.startswith("| bf16 |") and " x 128 |" not in line]
    assert [r[2].strip() for r in rows] == ["1", "2", "2 + a prompt every 2 steps"]
    header = next(line for line in (tmp_path / "step_profile.md").read_text().splitlines() if line.startswith("| engine |"))
    clock_column = header.split("|").index(" SM MHz ")
    for r in rows:
        step_ms, kernels_ms = float(r[3]), float(r[4])
        assert 0 < kernels_ms <= step_ms * 1.05  # operators ran, and within the step's wall time
        assert len(r) == len(header.split("|"))
        assert r[clock_column].strip() == "-" or float(r[clock_column].replace(",", "")) > 0  # no nvidia-smi: "-"
        assert float(r[header.split("|").index(" host waits ms ")]) >= 0  # the CPU: no CUDA synchronize calls
    assert "longest kernels" in out
    prefill = [line.split("|") for line in (tmp_path / "step_profile.md").read_text().splitlines()
               if line.startswith("| bf16 | 2 x 128 |")]
    assert len(prefill) == 1
    first, queued, wall, kernels, count = (float(v) for v in prefill[0][3:8])
    assert first > 0 and 0 < queued <= wall and kernels > 0 and count > 0  # operators ran, queued before it ended
    assert "prefill step, host operators by their own time" in out


def test_step_profile_sorts_kernel_names_into_kinds():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gpu_step_profile import kind_of
    finally:
        sys.path.pop(0)
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert kind_of("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT") == "gemm"
    assert kind_of("_decode_attention_kernel") == "attention"
    assert kind_of("_gemv_split_k_kernel") == "few-row triton"
    # the names G23 (session 10) put under the wrong kinds: the decode attention kernel, the bf16
    # few-row kernel and the fp8 split-K reduction
    assert kind_of("_decode_split_kernel") == "attention"
    assert kind_of("_skinny_kernel") == "few-row triton"
    assert kind_of("_reduce_kernel") == "few-row triton"
    assert kind_of("_add_rms_norm_kernel") == "norm"
    assert kind_of("Memcpy DtoD (Device -> Device)") == "copy"
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, silu>") == "other"


def test_spec_policy_probe_runs_auto_and_always():
    out = _run(["bench/spec_policy_probe.py", "-m", str(default_model_dir()), "--device", "cpu",
                "--batches", "1", "--requests", "1", "--max-tokens", "12"])
    summary = out.split("summary", 1)[1]
    assert "B=1 policy=auto:" in summary and "B=1 policy=always:" in summary


def test_pdl_bench_builds_off_then_on_and_compares_greedy_tokens(tmp_path):
    # On the CPU no Triton kernel runs, so PDL changes nothing there: this checks the script.
    _run(["bench/gpu_pdl.py", "--device", "cpu", "--shape", "qwen3-tiny", "--engines", "bf16", "--batches", "1",
          "--out", str(tmp_path)])
    rows = [line.split("|") for line in (tmp_path / "pdl.md").read_text().splitlines() if line.startswith("| bf16 |")]
    assert len(rows) == 1
    same, total = rows[0][6].strip().split("/")
    assert same == total == "128"  # 4 prompts x 32 greedy tokens, the same with PDL on
    assert float(rows[0][3].replace(",", "")) > 0 and float(rows[0][4].replace(",", "")) > 0


def test_fp8_fuse_bench_builds_each_engine_setting(tmp_path):
    _run(["bench/gpu_fp8_fuse.py", "--device", "cpu", "--batches", "1", "--engines", "bf16,fp8-fuse-norms",
          "--out", str(tmp_path)])
    table = (tmp_path / "fp8_fuse.md").read_text()
    rows = [line.split("|") for line in table.splitlines() if line.startswith(("| bf16 |", "| fp8-fuse-norms |"))]
    assert [r[1].strip() for r in rows] == ["bf16", "fp8-fuse-norms"] and all(float(r[2].replace(",", "")) > 0
                                                                            for r in rows)


def test_sass_loop_count_finds_the_k_loop_of_a_repacked_kernel():
    out = _run(["tools/sass_loop_count.py", "--config", "fma-n32-g2", "--rows", "1", "--top", "3"])
    head, *ops, resources = out.strip().splitlines()
    assert head.startswith("fma-n32-g2 Q4_K 1 row(s): ") and float(head.split()[-3]) > 1  # at least a FMA a weight
    assert len(ops) == 3 and "FFMA" in out  # the multiply-adds are in the loop
    registers = int(resources.split()[0])
    assert 16 <= registers <= 255 and "bytes of shared memory" in resources


def test_decode_registers_reports_both_decode_kernels():
    """tools/decode_registers.py compiles the split kernel and its merge for sm_90 and reads their registers and
    stack bytes from the cubin (counts that depend on the Triton version: only their form is checked)."""
    out = _run(["tools/decode_registers.py", "--warps", "2", "--splits", "8", "--caches", "e4m3"])
    version, *lines = out.strip().splitlines()
    assert version.startswith("triton ") and version.endswith("sm_90")
    assert [line.split()[:2] for line in lines] == [["_decode_split_kernel", "tile=64"], ["_decode_merge_kernel", "tile=64"]]
    for line in lines:
        registers, stack = int(line.split(": ")[1].split()[0]), int(line.split(", ")[1].split()[0])
        assert 16 <= registers <= 255 and stack >= 0, line


def test_the_quant_checks_name_configs_the_sweep_and_the_stalls_script_know(monkeypatch):
    """bench/gpu_quant_checks.sh's config names (part A's sweep, parts B and D's ncu launches) are
    `triton_gguf_repacked.CONFIGS` entries the sweep accepts; an unknown name stops the sweep."""

    from onebit.kernels import triton_gguf_repacked as tr

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_gguf_repacked
    finally:
        sys.path.pop(0)
    script = (ROOT / "bench" / "gpu_quant_checks.sh").read_text()
    sweep = re.search(r"CONFIGS=\$\{CONFIGS:-([^}]+)\}", script).group(1).split(",")
    stalls = [pair.split(":")[1] for pairs in re.findall(r'--configs "(Q[^"]+)"', script) for pair in pairs.split(",")]
    assert set(sweep + stalls) <= set(tr.CONFIGS) and len(sweep) == 4 and len(stalls) == 7
    monkeypatch.setenv("ONEBIT_SWEEP_CONFIGS", ",".join(sweep))
    assert list(gpu_gguf_repacked.sweep_configs()) == sweep
    monkeypatch.setenv("ONEBIT_SWEEP_CONFIGS", "fma-n64-g2,no-such-config")
    with pytest.raises(SystemExit, match="no-such-config"):
        gpu_gguf_repacked.sweep_configs()


def test_the_prepared_rows_sweep_times_every_shipped_pick_it_may_replace():
    """bench/gpu_prepared_rows.sh's configs are `triton_gguf_repacked.CONFIGS` entries and include the
    shipped table's pick at each of its types and row counts (type and shape keys): the merge only
    replaces a pick that the sweep timed beside its rival."""
    import json

    from onebit.kernels import triton_gguf_repacked as tr

    script = (ROOT / "bench" / "gpu_prepared_rows.sh").read_text()
    configs = re.search(r"CONFIGS=\$\{CONFIGS:-([^}]+)\}", script).group(1).split(",")
    types = re.search(r"TYPES=\$\{TYPES:-([^}]+)\}", script).group(1).split(",")
    rows = re.search(r"ROWS=\$\{ROWS:-([^}]+)\}", script).group(1).split(",")
    assert set(configs) <= set(tr.CONFIGS)
    names = {tuple(c): name for name, c in tr.CONFIGS.items()}
    table = json.loads(tr.TABLE_FILE.read_text())
    shipped = {names[tuple(tr.RepackedConfig(**table[key][m]))] for key in table if key.split()[0] in types
               for m in rows if m in table[key]}
    assert shipped and shipped <= set(configs), shipped - set(configs)


def test_the_file_ab_runs_each_side_on_its_tree_and_sums_up_the_sides(tmp_path):
    """bench/gpu_file_ab.sh on the CPU at toy size: side "old" runs on the tree with its folder laid
    over it, each run's figures and each side's mean and range are printed; a side without a folder,
    or with a name that would not make a file name, stops it before any run."""
    old = tmp_path / "ab" / "old" / "onebit" / "kernels"
    old.mkdir(parents=True)
    (old / "gguf_repacked_table.json").write_text((ROOT / "onebit/kernels/gguf_repacked_table.json").read_text())
    fake_bin = tmp_path / "bin"  # an nvidia-smi that prints two samples at once, then waits to be stopped
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nprintf '1980, 560.25, 0x0\\n1485, 694.48, 0x4\\n'\n"
                                         "exec sleep 60\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}", "WHEELS": "0",
           "AB_DIR": str(tmp_path / "ab"), "OUT": str(tmp_path / "out"), "TQDM_DISABLE": "1",
           "RUN_ARGS": "--runs q4km-packed --batches 1 --shape qwen3-tiny --device cpu --work " + str(tmp_path / "w")}

    def ab(runs: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "bench/gpu_file_ab.sh"], cwd=ROOT, env={**env, "RUNS": runs},
                              capture_output=True, text=True, timeout=300)

    done = ab("new,old")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "old tree: ./onebit/kernels/gguf_repacked_table.json" in done.stdout
    # each run's figures, with where its products' choices came from (a CPU times none: "none")
    assert "| new-1 | Q4_K_M packed | none |" in done.stdout and "| old-2 | Q4_K_M packed | none |" in done.stdout
    assert "| new | Q4_K_M packed | 1 |" in done.stdout and "| old | Q4_K_M packed | 1 |" in done.stdout
    assert {p.name for p in (tmp_path / "out").glob("*.json")} == {"new-1.json", "old-2.json"}
    run = json.loads((tmp_path / "out" / "new-1.json").read_text())["Q4_K_M packed"]
    assert run["calibration"] == [] and run["decode_tok_s"]["1"] > 0  # the CPU calibrates nothing
    # the clock while B=1 was timed: the fake's two samples, and a table row per run
    assert run["clocks"]["1"]["samples"] == 2 and run["clocks"]["1"]["reasons"] == ["power cap"]
    assert "| new-1 | Q4_K_M packed | 1,732 MHz (min 1,485), 627 W, slowed 50% (power cap) |" in done.stdout
    assert len(run["gc_pauses"]["1"]["collections"]) == 3  # the collector's pauses while B=1 was timed, a row a run
    assert "| new-1 | Q4_K_M packed | " in done.stdout.split("gc collections (0/1/2), ms |")[1]
    # a side that is a switch, primed (PRIME=1: its engine started once before its run)
    switched = subprocess.run(["bash", "bench/gpu_file_ab.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**env, "RUNS": "on", "SWITCHES": "on:onebit/kernels/fp8.py:CPU_EMULATES_GPU",
                                   "PRIME": "1", "ONEBIT_CALIBRATION_CACHE": str(tmp_path / "cc")})
    assert switched.returncode == 0, switched.stderr[-2000:]
    assert "on tree: onebit/kernels/fp8.py with CPU_EMULATES_GPU = True" in switched.stdout
    assert "prime on (its products into " + str(tmp_path / "cc") + ")" in switched.stdout
    # the priming start's row (a CPU times nothing: source "none"), before the run
    assert re.search(r"^\| Q4_K_M packed \| [0-9.]+ \| none \|$", switched.stdout, re.M), switched.stdout[-1500:]
    assert switched.stdout.index("prime on") < switched.stdout.index("1: on")
    assert "| on-1 | Q4_K_M packed | none |" in switched.stdout
    no_line = subprocess.run(["bash", "bench/gpu_file_ab.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**env, "RUNS": "on", "SWITCHES": "on:onebit/kernels/fp8.py:NO_SUCH_SWITCH"})
    assert no_line.returncode == 1 and 'side on: no line "NO_SUCH_SWITCH = False"' in no_line.stdout
    missing = ab("new,alt")
    assert missing.returncode == 1 and "no " + str(tmp_path / "ab" / "alt") + " for side alt" in missing.stdout
    bad = ab("new,old-2")
    assert bad.returncode == 1 and 'side name "old-2"' in bad.stdout


def test_the_g16_call_times_its_launches_beside_every_shipped_pick_of_its_types():
    """bench/gpu_g16.sh's configs are `triton_gguf_repacked.CONFIGS` entries, hold every g16 launch and the
    shipped Q4_K and Q6_K picks at its row counts (the merge replaces only a pick timed beside its rival)."""
    import json

    from onebit.kernels import triton_gguf_repacked as tr

    script = (ROOT / "bench" / "gpu_g16.sh").read_text()
    configs = re.search(r"CONFIGS=\$\{CONFIGS:-([^}]+)\}", script).group(1).split(",")
    rows = re.search(r"ROWS=\$\{ROWS:-([^}]+)\}", script).group(1).split(",")
    assert set(configs) <= set(tr.CONFIGS)
    assert {name for name, c in tr.CONFIGS.items() if c.mode == "g16"} <= set(configs)
    names = {tuple(c): name for name, c in tr.CONFIGS.items()}
    table = json.loads(tr.TABLE_FILE.read_text())
    types = re.search(r"TYPES=\$\{TYPES:-([^}]+)\}", script).group(1).split(",")
    shipped = {names[tuple(tr.RepackedConfig(**table[key][m]))] for key in table if key.split()[0] in types
               for m in rows if m in table[key]}
    assert types == ["Q4_K", "Q6_K"] and shipped and shipped <= set(configs), shipped - set(configs)


def test_the_fp8_attention_call_makes_its_side_from_a_line_that_exists():
    """bench/gpu_fp8_attention.sh makes side attn by rewriting `FUSED_PRODUCERS`: the line must be there as
    the script spells it."""
    script = (ROOT / "bench/gpu_fp8_attention.sh").read_text()
    assert (ROOT / "onebit/models/quantize.py").read_text().splitlines().count('FUSED_PRODUCERS = ("norm", "silu")') == 1
    assert """s/^FUSED_PRODUCERS = ("norm", "silu")$/FUSED_PRODUCERS = ("norm", "silu", "attention")/""" in script


def test_the_switches_docs_perf_md_asks_the_ab_to_flip_exist_as_gpu_file_ab_rewrites_them():
    """Every `SWITCHES=side:path:NAME` in docs/perf.md and in gpu_file_ab.sh's own header names a file whose
    line `NAME = False` exists once: gpu_file_ab.sh turns exactly that line on, and refuses the run otherwise."""
    text = " ".join((ROOT / name).read_text().replace("\n", " ") for name in ("docs/perf.md", "bench/gpu_file_ab.sh"))
    entries = {(path, name) for item in re.findall(r"SWITCHES=(\S+)", text)
               for path, name in re.findall(r"\w+:([\w/]+\.py):([A-Z][A-Z0-9_]*)", item)}
    assert ("onebit/kernels/fp8.py", "CPU_EMULATES_GPU") in entries  # the header's example
    for path, name in entries:
        assert (ROOT / path).read_text().splitlines().count(f"{name} = False") == 1, (path, name)


def test_gc_pauses_counts_and_times_the_collections_inside_it():
    """`onebit.bench.gc_pauses.GcPauses`: a full collection run inside the block is counted in generation 2
    and timed; one run after it is not counted."""
    import gc

    from onebit.bench.gc_pauses import GcPauses

    with GcPauses() as pauses:
        gc.collect()
        gc.collect(0)
    gc.collect()
    summary = pauses.summary()
    assert summary["collections"][2] == 1 and summary["collections"][0] >= 1
    assert 0 < summary["longest_s"] <= summary["seconds"]


def test_the_slow_mode_call_turns_on_a_line_that_exists():
    """bench/gpu_slow_mode.sh's RELEASE run turns `RELEASE_CALIBRATION_MEMORY = False` on in a copy of runner.py
    (device_lib.sh's `switch_on`): the line must be there once, and the script must name that file and switch."""
    script = (ROOT / "bench/gpu_slow_mode.sh").read_text()
    assert (ROOT / "onebit/engine/runner.py").read_text().splitlines().count("RELEASE_CALIBRATION_MEMORY = False") == 1
    assert 'switch_on "$tree/onebit/engine/runner.py" RELEASE_CALIBRATION_MEMORY' in script


def test_the_slow_mode_call_profiles_a_timing_and_a_restoring_engine(tmp_path):
    """bench/gpu_slow_mode.sh on the CPU at toy size (its profile's arguments replaced): the runs it makes,
    each one's decode table, the RELEASE run on a copy of the tree (this one's runner.py untouched)."""
    runner = (ROOT / "onebit/engine/runner.py").read_text()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "RELEASE": "1", "PROFILE_ARGS": "--engines bf16 --batches 1 --turnover 0 --steps 2 --device cpu "
                                           "--shape qwen3-tiny"}
    done = subprocess.run(["bash", "bench/gpu_slow_mode.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "failed" not in done.stdout, done.stdout[-2000:]
    assert [line for line in done.stdout.splitlines() if line.startswith("== ")] == ["== timed", "== restored",
                                                                                     "== released"]
    assert done.stdout.count("| bf16 | 1 |") == 3  # a decode row a run
    assert (ROOT / "onebit/engine/runner.py").read_text() == runner
