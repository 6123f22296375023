"""The environment snapshot and `perfkit env`, with and without an NVIDIA driver."""

from __future__ import annotations

import json
import re
import sys

import fake_nvml
import pytest

from perfkit.errors import UserError
from perfkit.machine import bandwidth
from perfkit.machine import snapshot as machine


@pytest.fixture
def no_driver(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.make(driver=False))


@pytest.fixture
def h100(monkeypatch):
    fake = fake_nvml.make(unsupported=("nvmlDeviceGetMaxPcieLinkWidth",))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def small_bandwidth(tmp_path, monkeypatch):
    """Real measurements on tiny arrays, cached under tmp_path."""
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bandwidth, "_cpu_array_bytes", lambda: 8 * 2**20)
    return tmp_path


def test_without_a_driver_the_snapshot_says_so_in_one_line(no_driver):
    snap = machine.snapshot(bandwidth=False)
    assert snap["gpus"] == []
    assert snap["gpu_note"] == "no NVIDIA driver: NVML Shared Library Not Found"
    assert snap["nvidia_driver"] is None
    text = machine.format_snapshot(snap)
    gpu_lines = [line for line in text.splitlines() if line.startswith("gpu")]
    assert gpu_lines == ["gpu        no NVIDIA driver: NVML Shared Library Not Found"]
    assert "Traceback" not in text


def test_snapshot_holds_cpu_memory_software_and_git(no_driver):
    snap = machine.snapshot(bandwidth=False)
    json.dumps(snap)  # JSON-able
    assert snap["cpu"]["logical_cores"] >= 1
    assert snap["cpu"]["model"]
    assert snap["memory"]["total_bytes"] > 2**28
    assert snap["python"]["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert snap["torch"]["version"].startswith("2.")
    assert snap["perfkit"]["version"]
    git = snap["perfkit"]["git"]
    assert re.fullmatch(r"[0-9a-f]{40}", git["commit"]) and isinstance(git["dirty"], bool)
    assert "bandwidth" not in snap


def test_snapshot_records_the_git_state_of_the_checkout_it_is_given(no_driver, tmp_path):
    git = machine.snapshot(bandwidth=False, root=tmp_path)["perfkit"]["git"]
    assert git["commit"] is None and git["dirty"] is None and str(tmp_path) in git["note"]
    assert "not a git checkout" in machine.format_snapshot(machine.snapshot(bandwidth=False, root=tmp_path))


def test_gpu_fields_come_from_nvml_with_derived_peak_bandwidth(h100):
    snap = machine.snapshot(bandwidth=False)
    assert snap["gpu_note"] is None
    assert snap["nvidia_driver"] == "550.54.15"
    (g,) = snap["gpus"]
    assert g["name"] == "NVIDIA H100 80GB HBM3"  # bytes from old pynvml decoded
    assert g["memory_total_bytes"] == 85_520_809_984
    assert g["sm_clock_mhz"] == {"current": 1980, "max": 1980}
    assert g["mem_clock_mhz"] == {"current": 2619, "max": 2619}
    assert g["memory_bus_width_bits"] == 5120
    # 2619 MHz x 2 transfers x 5120 bit / 8 = 3.352 TB/s, the H100 SXM datasheet's 3.35 TB/s
    assert g["peak_dram_bytes_per_s"] == pytest.approx(3.35232e12)
    assert g["power_w"] == pytest.approx(123.456)
    assert g["power_limit_w"] == pytest.approx(700.0)
    assert g["temperature_c"] == 41
    assert g["pcie"] == {"gen": 5, "width": 16, "max_gen": 5, "max_width": None}  # unsupported query -> None
    assert h100.calls[-1] == "nvmlShutdown"
    text = machine.format_snapshot(snap)
    assert "NVIDIA H100 80GB HBM3 (driver 550.54.15)" in text
    assert "peak 3.35 TB/s" in text
    assert "PCIe gen 5 x16 (max gen 5 x?)" in text


def test_peak_bandwidth_needs_both_clock_and_bus_width():
    assert machine.peak_dram_bytes_per_s(1593, 5120) == pytest.approx(2.039e12, rel=1e-3)  # A100 80GB
    assert machine.peak_dram_bytes_per_s(None, 5120) is None
    assert machine.peak_dram_bytes_per_s(1593, None) is None


def test_env_prints_bandwidth_with_interval_and_reuses_it(small_bandwidth, no_driver, capsys):
    assert machine.main([]) == 0
    first = capsys.readouterr().out
    assert re.search(r"cpu triad [\d.]+ GB/s \[[\d.]+, [\d.]+\] \(95% CI", first)
    assert "measured now" in first
    assert machine.main([]) == 0
    second = capsys.readouterr().out
    assert "cached" in second and "--refresh" in second and "measured now" not in second
    triad = [line for line in first.splitlines() if "cpu triad" in line]
    assert triad and triad[0].split("cpu triad")[1] in second  # the same figure, not a new one
    assert machine.main(["--refresh"]) == 0
    assert "measured now" in capsys.readouterr().out


def test_env_json_is_the_snapshot(no_driver, capsys):
    assert machine.main(["--json", "--no-bandwidth"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["format_version"] == machine.FORMAT_VERSION
    assert snap["gpu_note"].startswith("no NVIDIA driver:")


def test_env_rejects_refresh_without_bandwidth():
    with pytest.raises(UserError, match="--refresh"):
        machine.main(["--refresh", "--no-bandwidth"])
