"""The simulated nvidia-smi's pure parts: its command line and its CSV, against a host dir on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.sandbox.hosttools import nvidia_smi


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "gpus").mkdir()
    (tmp_path / "knobs.json").write_text(json.dumps({"gpus": 2, "gpu_name": "NVIDIA B200"}))
    return tmp_path


def register(root: Path, pid: int, gpus: list[int], memory: int, **extra: object) -> None:
    entry = {"pid": pid, "name": "python", "gpus": gpus, "memory_mib": memory, **extra}
    (root / "gpus" / f"{pid}.json").write_text(json.dumps(entry))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], "0, 0\n1, 0\n"),
        (["--query-gpu", "index,memory.total", "--format", "csv,noheader"], "0, 97887 MiB\n1, 97887 MiB\n"),
        (["-i", "1", "--query-gpu=name,compute_cap", "--format=csv"], "name, compute_cap\nNVIDIA B200, 12.0\n"),
        (["--query-compute-apps=pid,used_memory", "--format=csv"], "pid, used_gpu_memory [MiB]\n"),
    ],
)
def test_query_forms(root: Path, argv: list[str], expected: str) -> None:
    assert nvidia_smi.render(root, nvidia_smi.parse_args(argv)) == expected


@pytest.mark.parametrize("argv", [["--query-gpu"], ["--bogus"], ["--query-gpu=index", "--format=json"]])
def test_bad_command_lines_are_usage_failures(root: Path, argv: list[str]) -> None:
    with pytest.raises(nvidia_smi.UsageFailure):
        nvidia_smi.render(root, nvidia_smi.parse_args(argv))


def test_live_registrations_count_and_dead_or_reused_pids_do_not(root: Path) -> None:
    me = os.getpid()
    register(root, me, [0, 1], 1000, start_time=nvidia_smi.process_start_time(me), utilization=40)
    register(root, 2**22 + 7, [0], 5000)  # no such process
    register(root, 1, [1], 7000, start_time=-1)  # pid 1 lives, but started at another time: a reused pid
    options = nvidia_smi.parse_args(["--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits"])
    assert nvidia_smi.render(root, options) == "0, 1000, 40\n1, 1000, 40\n"
    apps = nvidia_smi.gpu_processes(root)
    assert [(p.pid, p.gpu_index, p.used_memory) for p in apps] == [(me, 0, 1000), (me, 1, 1000)]


def test_uuids_are_stable_per_host_and_index(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert nvidia_smi.gpu_uuid(a, 0) == nvidia_smi.gpu_uuid(a, 0) != nvidia_smi.gpu_uuid(a, 1)
    assert nvidia_smi.gpu_uuid(a, 0) != nvidia_smi.gpu_uuid(b, 0)


def test_query_answers_the_real_layout_with_each_fault_on_its_gpu(root: Path) -> None:
    from orchestrator.facts import health

    faults = {name: i % 2 for i, name in enumerate(nvidia_smi.FAULTS)}
    (root / "knobs.json").write_text(json.dumps({"gpus": 2, "gpu_faults": faults, "driver_version": "570.1"}))
    report = health.parse_query(nvidia_smi.render(root, nvidia_smi.parse_args(["-q"])))
    assert (report.driver, report.cuda, report.attached, len(report.gpus)) == ("570.1", "13.0", 2, 2)
    found = [f.text.split(":")[0] for f in health.check_gpus(report, 2)]
    assert sorted(set(found)) == ["GPU 0", "GPU 1"] and len(found) == len(nvidia_smi.FAULTS) + 1  # blacklist too
