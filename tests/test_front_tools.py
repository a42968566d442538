"""The front's measuring tools count what they measure: bench/front_speed.py --in-process and
bench/front_cpu.py's /proc readings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_in_process_counts_every_event(endpoint):
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    out = subprocess.run([sys.executable, str(BENCH / "front_speed.py"), "--in-process", "--concurrency", "4",
                          "--requests", "6", "--max-tokens", "5", "--endpoint", endpoint], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    match = re.search(r"C=4, (\w+): (\d+) events \((\d+) tokens\) in [\d.]+ s, app CPU [\d.]+ s = [\d.]+ us", out)
    assert match, out
    assert match.group(1) == endpoint and int(match.group(3)) == 6 * 5
    assert 6 <= int(match.group(2)) <= 6 * 5  # a token an event, fewer where a lagging stream got steps merged


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_proc_cpu_readings():
    sys.path.insert(0, str(BENCH))
    try:
        import front_cpu
    finally:
        sys.path.remove(str(BENCH))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in front_cpu.children(os.getpid())
        before = front_cpu.cpu_seconds(os.getpid())
        end = time.process_time() + 0.2
        while time.process_time() < end:  # burn 0.2 s of CPU
            pass
        assert front_cpu.cpu_seconds(os.getpid()) - before >= 0.1
        assert set(front_cpu.snapshot(os.getpid())) >= {os.getpid(), child.pid}
    finally:
        child.kill()
        child.wait()
