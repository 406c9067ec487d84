"""Issue 13 §7: broken or hostile output from a host is a clear per-host error (exit 3), never a
traceback: nvidia-smi answering garbage, a tuned config file or a model config.json of the wrong
shape. Real CLI over real sshd, simulated fleet."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import FleetEnv
from tests.integration.test_tune import DEVICE, FAST, configs_dir, tuned_files

# A driver half-upgraded: the GPU line has every field, but the index is not a number.
GARBAGE = "abc, NVIDIA RTX PRO 6000, GPU-x, 97887, 0, 0, 12.0"


def answer_nvidia_smi_with(host: Any, text: str) -> None:
    """Replace the host's nvidia-smi (first on its PATH) by one that prints ``text`` and exits 0."""
    smi = Path(host.disk.bin) / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' {json.dumps(text)}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


def test_garbage_from_nvidia_smi_is_a_per_host_error_in_status_and_tune_fp8(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(2)
    bad, good = env.fleet.hosts  # type: ignore[attr-defined]
    answer_nvidia_smi_with(bad, GARBAGE)
    status = env.orch("status")
    assert "Traceback" not in status.output, status.output
    assert "nvidia-smi answered a line that is not a GPU (field 1 'abc' is not a number)" in status.output
    assert good.name in status.stdout
    tune = env.orch("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1,2", "--host", bad.name)
    assert tune.returncode == 3, tune.output
    assert "Traceback" not in tune.output
    assert f"{bad.name}: nvidia-smi answered a line that is not a GPU (field 1 'abc' is not a number)" in tune.output


def test_a_malformed_tuned_config_or_model_config_is_a_per_host_answer_not_a_traceback(
    make_fleet: Callable[..., FleetEnv],
) -> None:
    env = make_fleet(1)
    (host,) = env.fleet.hosts  # type: ignore[attr-defined]
    host.set_knobs(tune_seconds_per_unit=FAST)
    args = ("tune-fp8", "--shapes", "N=1024,K=4096", "--batch-sizes", "1,2", "--wait")
    first = env.orch(*args)
    assert first.returncode == 0, first.output
    (path,) = configs_dir(host).glob(f"N=1024,K=4096,device_name={DEVICE.replace(' ', '_')},*")
    path.write_text(json.dumps({"\u00b2": {"BLOCK_SIZE_M": 64}}))  # a "digit" that is not a batch size
    again = env.orch(*args)
    assert "Traceback" not in again.output, again.output
    assert again.returncode == 0, again.output  # the broken file is not "tuned": tuned again
    assert sorted(tuned_files(host)) == ["N=1024,K=4096"]

    config = Path(host.disk.model_path) / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "architectures": 3}))
    auto = env.orch("tune-fp8", "--shapes", "auto", "--batch-sizes", "1,2")
    assert "Traceback" not in auto.output, auto.output
    assert auto.returncode == 3, auto.output
    assert f"{host.name}: --shapes auto: " in auto.output and "architectures 3 is not a list" in auto.output
