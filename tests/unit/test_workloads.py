"""The burner and holder of the test image really use the CPU and memory they claim."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from koord_testing.image import compile_pause
from koord_testing.workloads import burn_command, hold_command


@pytest.fixture(scope="module")
def pause_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pause(tmp_path_factory.mktemp("pause"))


def _run(binary: Path, argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([str(binary), *argv[1:]], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "burning ..." / "holding ...": set up
    return proc


def _children_demand_seconds(pid: int) -> float:
    """Seconds the burner's workers ran plus waited to run (/proc/<pid>/schedstat): what they
    asked for, which on a busy shared machine is more than what they got."""
    total = 0
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        on_cpu, waiting, _ = Path(f"/proc/{child}/schedstat").read_text().split()
        total += int(on_cpu) + int(waiting)
    return total / 1e9


@pytest.mark.parametrize("cores", [0.5, 1, 2])
def test_burn_asks_for_the_cores_given(pause_binary, cores):
    proc = _run(pause_binary, burn_command(cores))
    try:
        before, t0 = _children_demand_seconds(proc.pid), time.monotonic()
        time.sleep(2)
        demand = (_children_demand_seconds(proc.pid) - before) / (time.monotonic() - t0)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
    assert rc == 0
    assert demand == pytest.approx(cores, rel=0.15)


def test_hold_touches_the_memory(pause_binary):
    proc = _run(pause_binary, hold_command(64))
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
    assert rc == 0
    assert 64 * 1024 <= rss_kib <= 64 * 1024 + 4096


@pytest.mark.parametrize("argv", [["burn", "0"], ["burn", "x"], ["burn", "-1"], ["hold", "0"], ["hold", "1e3"]])
def test_bad_arguments_exit_2(pause_binary, argv):
    assert subprocess.run([str(pause_binary), *argv], capture_output=True).returncode == 2


def test_command_helpers_check_their_arguments():
    assert burn_command(1) == ["/pause", "burn", "1"]
    assert hold_command(200) == ["/pause", "hold", "200"]
    for bad in (lambda: burn_command(0), lambda: hold_command(0)):
        with pytest.raises(ValueError):
            bad()
