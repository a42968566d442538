"""The GPU clock sampler that benchmarks wrap their timed work in: nvidia-smi's lines parsed and
summarized, a fake nvidia-smi standing in for the driver (CI has none), no driver meaning no summary."""

from __future__ import annotations

import time

from onebit.bench.gpu_clocks import ClockSampler, describe, parse_samples, summarize

LINES = ["1980, 560.25, 0x0000000000000000", "1485, 694.48, 0x0000000000000004", "[N/A], 120.00, 0x0",
         "1755, 656.23, 0x0000000000000024", "1965, 66"]


def test_lines_that_do_not_parse_are_skipped():
    assert parse_samples("\n".join(LINES)) == [(1980.0, 560.25, 0), (1485.0, 694.48, 4), (1755.0, 656.23, 0x24)]


def test_the_summary_counts_slowed_samples_and_names_their_reasons():
    summary = summarize(parse_samples("\n".join(LINES)))
    assert summary == {"samples": 3, "sm_mhz_mean": 1740.0, "sm_mhz_min": 1485.0, "power_w_mean": 637.0,
                       "power_w_max": 694.48, "slowed_share": 0.667, "reasons": ["power cap", "thermal"]}
    assert describe(summary) == "1,740 MHz (min 1,485), 637 W, slowed 67% (power cap, thermal)"
    assert summarize([]) is None and describe(None) == "-"
    idle_bit = summarize([(345.0, 77.0, 0x1)])  # the GPU idle: not a slowdown
    assert idle_bit["slowed_share"] == 0 and idle_bit["reasons"] == []


def test_the_sampler_reads_what_nvidia_smi_printed_while_the_block_ran(tmp_path):
    printed = tmp_path / "printed"
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in LINES[:2])
                    + f"touch {printed}\nexec sleep 60\n")
    fake.chmod(0o755)
    with ClockSampler(command=str(fake), interval_ms=50) as clocks:
        deadline = time.monotonic() + 20
        while not printed.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    assert clocks.process.returncode is not None  # stopped with the block
    assert clocks.samples == [(1980.0, 560.25, 0), (1485.0, 694.48, 4)]
    assert clocks.summary()["samples"] == 2


def test_entering_waits_for_the_first_sample_so_a_short_block_gets_one(tmp_path):
    fake = tmp_path / "nvidia-smi"  # one sample after a pause, then nothing until stopped
    fake.write_text(f"#!/bin/sh\nsleep 0.3\nprintf '{LINES[1]}\\n'\nexec sleep 60\n")
    fake.chmod(0o755)
    with ClockSampler(command=str(fake)) as clocks:
        pass
    assert clocks.samples == [(1485.0, 694.48, 4)]


def test_without_nvidia_smi_there_is_no_summary(tmp_path):
    with ClockSampler(command=str(tmp_path / "missing" / "nvidia-smi")) as clocks:
        pass
    assert clocks.process is None and clocks.summary() is None


def test_no_index_samples_nothing(tmp_path):
    """ClockSampler(None): what a benchmark without `--gpu-clocks` holds; it starts no nvidia-smi."""
    ran = tmp_path / "ran"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\nprintf '{LINES[0]}\\n'\nexec sleep 60\n")
    fake.chmod(0o755)
    with ClockSampler(None, command=str(fake)) as clocks:
        pass
    assert clocks.process is None and clocks.summary() is None and not ran.exists()
    with ClockSampler(0, command=str(fake)) as clocks:  # the same fake, given an index, does run
        pass
    assert ran.exists() and clocks.summary()["samples"] == 1
