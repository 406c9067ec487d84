"""``orch doctor`` over real sshd: each fault the simulator can report makes the exact line doctor prints.

One 3-host fleet for the module; each test puts one fault on sim-2 (a knob of the simulated
``nvidia-smi -q``, kernel log or ``df``, or a change to its files) and takes it away after. Every host
reports 500 GiB free unless a test says otherwise, so the machine's own disk never decides a line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.sandbox.modelconfig import SHARDS
from orchestrator.store import StateStore
from tests.conftest import FleetEnv, OrchRun, write_fleet_inventory

ROOMY = {"disk_free_mib": 500 * 1024}
GOOD = ["sim-1: ok", "sim-3: ok"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetEnv]:
    from orchestrator.sandbox import SimFleet

    root = tmp_path_factory.mktemp("doctor")
    with SimFleet(root / "fleet", n_hosts=3) as fleet:
        for host in fleet.hosts:
            host.set_knobs(**ROOMY)
        yield FleetEnv(fleet, write_fleet_inventory(fleet, root / "hosts.yaml"), root / "state" / "state.json")


@pytest.fixture
def env(shared: FleetEnv) -> Iterator[FleetEnv]:
    """The shared fleet; whatever knobs a test set on its hosts are put back after it."""
    before = [dict(h.knobs()) for h in shared.fleet.hosts]  # type: ignore[attr-defined]
    yield shared
    for host, knobs in zip(shared.fleet.hosts, before, strict=True):  # type: ignore[attr-defined]
        host.set_knobs(**{k: knobs.get(k) for k in {*host.knobs(), *knobs}})


def sick(env: FleetEnv) -> Any:
    return env.fleet.hosts[1]  # type: ignore[attr-defined]


def lines(run: OrchRun) -> list[str]:
    return run.stdout.splitlines()


def mount_of(path: Path) -> str:
    return subprocess.run(["df", "-P", str(path)], capture_output=True, text=True).stdout.splitlines()[-1].split()[5]


def test_a_healthy_fleet_is_ok_on_every_host(env: FleetEnv) -> None:
    run = env.orch("doctor")
    assert (run.returncode, lines(run)) == (0, ["sim-1: ok", "sim-2: ok", "sim-3: ok"]), run.output


GPU_FAULTS = [
    (
        "persistence_off",
        0,
        "sim-2: warn: GPU 5: persistence mode off (each start re-initialises the GPU; `nvidia-smi -pm 1`)",
    ),
    ("ecc_uncorrectable", 3, "sim-2: fail: GPU 2: uncorrectable ECC errors since boot: DRAM Uncorrectable 2"),
    (
        "retired_pages",
        0,
        "sim-2: warn: GPU 2: 3 memory pages retired for double-bit ECC errors; "
        "GPU 2: a page retirement is pending (takes effect at the next GPU reset)",
    ),
    (
        "row_remap_failure",
        3,
        "sim-2: fail: GPU 2: row remapping failed (memory it cannot repair: a candidate for replacement)",
    ),
    ("row_remap_pending", 0, "sim-2: warn: GPU 2: a row remapping is pending (takes effect at the next GPU reset)"),
    ("hw_slowdown", 3, "sim-2: fail: GPU 2: clocks slowed: HW Slowdown, HW Thermal Slowdown"),
    ("sw_thermal", 0, "sim-2: warn: GPU 2: clocks slowed: SW Thermal Slowdown"),
    ("pcie_x4", 3, "sim-2: fail: GPU 2: PCIe link x4, the GPU's maximum is x16"),
]


@pytest.mark.parametrize("fault, code, line", GPU_FAULTS, ids=[f[0] for f in GPU_FAULTS])
def test_each_gpu_fault_nvidia_smi_reports_is_named(env: FleetEnv, fault: str, code: int, line: str) -> None:
    gpu = 5 if fault == "persistence_off" else 2
    sick(env).set_knobs(gpu_faults={fault: gpu})
    run = env.orch("doctor")
    assert (run.returncode, lines(run)) == (code, ["sim-1: ok", line, "sim-3: ok"]), run.output


@pytest.mark.parametrize(
    "knobs, code, line",
    [
        ({"gpus": 7}, 3, "sim-2: fail: 7 GPUs, the inventory says 8"),
        ({"xid_events": [[79, 2], [79, 2]]}, 3, "sim-2: fail: GPU 2: Xid 79 (GPU fell off the bus) since boot, 2x"),
        ({"xid_events": [[13, 0]]}, 0, "sim-2: warn: GPU 0: Xid 13 since boot, 1x"),
        (
            {"kernel_log_unreadable": True},
            0,
            "sim-2: ok (Xid events not checked: neither dmesg nor journalctl -k can be read by this user)",
        ),
        (
            {"kernel_log_unreadable": "user_journal"},
            0,
            "sim-2: ok (Xid events not checked: neither dmesg nor journalctl -k can be read by this user)",
        ),
        (
            {"nvidia_smi_fail": True},
            3,
            "sim-2: fail: nvidia-smi -q: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver. Make sure that the latest NVIDIA driver is installed and running.",
        ),
    ],
    ids=["gpu-count", "xid-fatal", "xid-other", "kernel-log-unreadable", "user-journal-only", "driver-gone"],
)
def test_gpu_count_kernel_log_and_driver_faults_are_named(
    env: FleetEnv, knobs: dict[str, object], code: int, line: str
) -> None:
    sick(env).set_knobs(**knobs)
    run = env.orch("doctor")
    assert (run.returncode, lines(run)) == (code, ["sim-1: ok", line, "sim-3: ok"]), run.output


def test_a_driver_that_differs_from_the_fleet_warns(env: FleetEnv) -> None:
    sick(env).set_knobs(driver_version="570.86.10")
    run = env.orch("doctor")
    expected = ["sim-1: ok", "sim-2: warn: driver 570.86.10, the fleet's is 580.95.05 (2 of 3)", "sim-3: ok"]
    assert (run.returncode, lines(run)) == (0, expected), run.output


@pytest.mark.parametrize(
    "free_mib, code, verdict", [(512, 3, "fail: 0.5 GiB free"), (10 * 1024, 0, "warn: 10.0 GiB free")]
)
def test_a_full_disk_is_named_with_what_lives_there(env: FleetEnv, free_mib: int, code: int, verdict: str) -> None:
    host = sick(env)
    host.set_knobs(disk_free_mib=free_mib)
    run = env.orch("doctor")
    paths = ", ".join(str(p) for p in (host.workdir, host.model_path, host.root / "home" / ".cache", host.sglang_dir))
    margin = ", below the 20.0 GiB margin" if code == 0 else ""
    line = f"sim-2: {verdict} on {mount_of(host.root)} ({paths}){margin}"
    assert (run.returncode, lines(run)) == (code, ["sim-1: ok", line, "sim-3: ok"]), run.output


@pytest.fixture
def moved_shard(env: FleetEnv) -> Iterator[Path]:
    model = sick(env).model_path
    shard, aside = model / SHARDS[1], model.parent / "aside"
    shutil.move(shard, aside)
    yield model
    shutil.move(aside, shard)


def test_a_missing_shard_fails_the_host(env: FleetEnv, moved_shard: Path) -> None:
    run = env.orch("doctor")
    line = f"sim-2: fail: model {moved_shard}: missing or empty: {SHARDS[1]}"
    assert (run.returncode, lines(run)) == (3, ["sim-1: ok", line, "sim-3: ok"]), run.output


def test_a_python_that_does_not_import_the_checkout_fails(env: FleetEnv, tmp_path: Path) -> None:
    document = yaml.safe_load(env.inventory.read_text())
    document["hosts"]["sim-2"]["python"] = "/usr/bin/python3"
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump(document))
    run = FleetEnv(env.fleet, inventory, env.state).orch("doctor", "sim-2")
    line = "sim-2: fail: python /usr/bin/python3 cannot import sglang (`orch pull --install`)"
    assert (run.returncode, lines(run)) == (3, [line]), run.output


def test_json_gives_each_finding_and_the_versions(env: FleetEnv) -> None:
    sick(env).set_knobs(gpu_faults={"pcie_x4": 1})
    run = env.orch("doctor", "sim-2", "--json")
    assert run.returncode == 3, run.output
    assert json.loads(run.stdout)["hosts"] == [  # the shape of status --json and jobs --json
        {
            "name": "sim-2",
            "verdict": "fail",
            "findings": [{"severity": "fail", "text": "GPU 1: PCIe link x4, the GPU's maximum is x16"}],
            "driver": "580.95.05",
            "cuda": "13.0",
            "gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "simulated": None,  # nothing measured without --nccl
        }
    ]


def test_an_unreachable_host_fails_and_the_others_are_checked(env: FleetEnv) -> None:
    host = sick(env)
    host.stop_sshd()
    try:
        run = env.orch("--connect-timeout", "2", "doctor")
        doc = json.loads(env.orch("--connect-timeout", "2", "doctor", "sim-2", "--json").stdout)
    finally:
        host.start_sshd()
    assert run.returncode == 3, run.output
    assert [lines(run)[0], lines(run)[2]] == GOOD and lines(run)[1].startswith("sim-2: fail: "), run.output
    (unreachable,) = doc["hosts"]  # every key there, null where not read
    assert (unreachable["verdict"], unreachable["driver"], unreachable["cuda"], unreachable["gpu"]) == ("fail",) + (
        None,
    ) * 3


def test_run_campaigns_on_the_healthy_hosts_and_names_the_sick_ones_problem(env: FleetEnv, tmp_path: Path) -> None:
    sick(env).set_knobs(gpu_faults={"pcie_x4": 2})
    own = FleetEnv(env.fleet, env.inventory, tmp_path / "state" / "state.json")
    run = own.orch("run", "--only", "pull")
    assert run.returncode == 3, run.output
    assert "sim-2: doctor fails this host: GPU 2: PCIe link x4, the GPU's maximum is x16" in run.stderr, run.output
    assert "sim-2: refused before any step: nothing was started or stopped" in run.stderr, run.output
    hosts = StateStore(own.state).read().hosts
    assert [list(hosts[name].steps.done) for name in ("sim-1", "sim-3")] == [["pull"], ["pull"]]  # type: ignore[union-attr]
    assert hosts["sim-2"].steps is None  # refused before any step: nothing ran, nothing recorded or forgotten
    assert hosts["sim-2"].phase.value == "new"


FIX = "set NCCL_P2P_DISABLE=1 in the host's env in hosts.yaml"


def test_nccl_names_a_hang_with_peer_to_peer_and_the_setting_that_avoids_it(env: FleetEnv) -> None:
    """The simulator cannot run torch: its hosts' python has a simulated torch whose all-reduce answers
    a scripted result from the knobs (hosttools/torch_stub), through the very script doctor runs."""
    sick(env).set_knobs(nccl_p2p_hang=True)
    env.fleet.hosts[2].set_knobs(nccl_p2p_slowdown=4)  # type: ignore[attr-defined]
    run = env.orch("doctor", "--nccl", "--nccl-timeout", "2")
    assert run.returncode == 3, run.output
    first, second, third = lines(run)
    assert first.startswith("sim-1: ok (NCCL all-reduce ") and first.endswith(" without P2P) [simulated])"), run.output
    assert second == f"sim-2: fail: NCCL all-reduce hangs with peer-to-peer on (2 s; {FIX})", run.output
    assert third.startswith("sim-3: warn: NCCL all-reduce ") and third.endswith(
        f"x slower with peer-to-peer on ({FIX}) [simulated]"
    )
    documents = json.loads(env.orch("doctor", "--nccl", "--nccl-timeout", "2", "--json").stdout)["hosts"]
    assert [h["simulated"] for h in documents] == [True, True, True]  # sim-2's P2P hung; without it, measured
