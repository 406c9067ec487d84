"""Values orch cannot use literally (issue 13): a control character in an inventory path is exit 2.

A newline in ``sglang_dir`` used to make ``tune-fp8`` exit 0 having installed the configs into the
path cut at the newline, not the one written in hosts.yaml.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from tests.conftest import FleetEnv

SMALL = ("--shapes", "N=1024,K=4096", "--batch-sizes", "1,2")


def test_newline_in_sglang_dir_is_exit_2_and_nothing_runs(make_fleet: Callable[..., FleetEnv]) -> None:
    env = make_fleet(1)
    host = env.fleet.hosts[0]  # type: ignore[attr-defined]
    document = yaml.safe_load(env.inventory.read_text())
    entry = document["hosts"][host.name]
    entry["sglang_dir"] = f"{host.sglang_dir}\n/elsewhere"
    env.inventory.write_text(yaml.safe_dump(document))
    run = env.orch("tune-fp8", *SMALL, "--wait")
    assert run.returncode == 2, run.output
    assert f"{env.inventory}: host '{host.name}', key 'sglang_dir': holds a control character ('\\n'" in run.stderr
    assert "Traceback" not in run.output
    assert not (Path(host.workdir) / "jobs").exists() or not any((Path(host.workdir) / "jobs").iterdir())
    assert not env.state.exists()
