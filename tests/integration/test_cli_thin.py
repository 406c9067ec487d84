"""Issue 9, the thin CLI: each host's own recipe, one peer resolver with the inventory check.

Over real sshd: `orch run` applied the first host's recipe to every host, and `serve`/`run` resolved the
other members of a `--fleet` tuning group without the inventory check `tune-fp8` makes (a KeyError
traceback where `tune-fp8` refuses cleanly).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.recipe import PACKAGED_PLAYBOOKS
from tests.conftest import FleetEnv

MakeFleet = Callable[..., FleetEnv]
SMALL = ("--shapes", "N=1024,K=4096;N=4096,K=2048", "--batch-sizes", "1,2,4,8,16,32,64,128")


def edit_inventory(env: FleetEnv, edit: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    document = yaml.safe_load(env.inventory.read_text())
    edit(document["hosts"])
    env.inventory.write_text(yaml.safe_dump(document, sort_keys=False))


def pull_only_playbook(directory: Path) -> None:
    """``playbooks/pull-only.yaml`` beside the inventory: the shipped recipe with one step."""
    document = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    document["steps"] = ["pull"]
    (directory / "playbooks").mkdir(exist_ok=True)
    (directory / "playbooks" / "pull-only.yaml").write_text(yaml.safe_dump(document))


def test_run_gives_each_host_its_own_playbook_from_the_inventory(make_fleet: MakeFleet) -> None:
    env = make_fleet(2)
    first, second = (h.name for h in env.fleet.hosts)  # type: ignore[attr-defined]
    pull_only_playbook(env.inventory.parent)
    edit_inventory(env, lambda hosts: hosts[second].update(playbook="pull-only"))
    run = env.orch("run", "--dry-run")
    assert run.returncode == 0, run.output
    first_plan, second_plan = run.stdout.split(f"\n{second}:\n")
    assert first_plan.startswith(f"{first}:\n")
    assert "step serve:" in first_plan and "step tune-fp8:" in first_plan
    assert "step pull:" in second_plan
    assert "step serve:" not in second_plan and "step tune-fp8:" not in second_plan


@pytest.mark.parametrize("command", [("tune-fp8", *SMALL), ("serve", "--yes"), ("run", "small-tune", "--yes")])
def test_a_tuning_group_member_gone_from_the_inventory_is_a_clean_refusal_in_every_command(
    make_fleet: MakeFleet, command: tuple[str, ...]
) -> None:
    """Each command asks the shapes the running group tunes (else it is refused for asking others, first)."""
    env = make_fleet(2)
    kept, gone = (h.name for h in env.fleet.hosts)  # type: ignore[attr-defined]
    document = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    document["steps"] = [{"tune-fp8": {"shapes": SMALL[1], "batch_sizes": [int(b) for b in SMALL[3].split(",")]}}]
    (env.inventory.parent / "playbooks").mkdir(exist_ok=True)
    (env.inventory.parent / "playbooks" / "small-tune.yaml").write_text(yaml.safe_dump(document))
    for host in env.fleet.hosts:  # type: ignore[attr-defined]
        host.set_knobs(tune_seconds_per_unit=600.0)  # the group's jobs run for the whole test
    started = env.orch("tune-fp8", "--fleet", *SMALL)
    assert started.returncode == 0, started.output
    edit_inventory(env, lambda hosts: hosts.pop(gone))
    run = env.orch(*command, "--host", kept)
    assert run.returncode == 3, run.output
    assert f"{gone}: a member of this tuning group is no longer in the inventory" in run.stderr
    assert "Traceback" not in run.output and "internal error" not in run.output
