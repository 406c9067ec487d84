"""Values orch cannot use literally (issue 13): a control character in an inventory path is exit 2.

A newline in ``sglang_dir`` used to make ``tune-fp8`` exit 0 having installed the configs into the
path cut at the newline, not the one written in hosts.yaml.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from orchestrator.state_migration import database_path
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
    assert not database_path(env.state).exists()


# --- hostile values through a whole campaign ----------------------------------------------------------


def hostile(canary: str) -> str:
    """A path component (or value) with everything a shell would act on; ``canary`` is what it would create."""
    return f"x $(touch {canary}) `touch {canary}`; touch {canary} | & > * ~ 'q' \"d\" \\ "


def orch_base(env: FleetEnv) -> list[str]:
    return env.argv()


def argv_of(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def touches_of(canary: str) -> list[str]:
    """Processes running now whose program is ``touch`` and whose arguments name the canary."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"touch") and any(canary.encode() in a for a in argv[1:]):
            found.append(f"{cmdline.parent.name}: {argv!r}")
    return found


def test_hostile_values_in_every_path_key_env_and_tag_are_used_literally_through_a_whole_campaign(
    make_fleet: Callable[..., FleetEnv], tmp_path: Path
) -> None:
    from orchestrator.sandbox import hostdisk
    from orchestrator.store import StateStore
    from tests.integration.test_faults_secrets import FAST, process_tree, small_playbook

    env = make_fleet(1)
    sim = env.fleet.hosts[0]  # type: ignore[attr-defined]
    sim.set_knobs(**FAST)
    canary = f"pwned-{uuid.uuid4().hex[:8]}"  # relative: a shell would create it in its working directory
    absolute_canary = tmp_path / "pwned-absolute"
    odd = hostile(canary)
    sglang_dir = sim.root / f"sglang {odd}"
    subprocess.run(["cp", "-a", str(sim.sglang_dir), str(sglang_dir)], check=True)
    python_dir = sim.root / f"python {odd}"  # a real venv importing SGLang from the odd checkout
    hostdisk.install_venv(env.fleet.root / "venv-template", python_dir, sglang_dir / "python")  # type: ignore[attr-defined]
    model_path = sim.root / f"models {odd}" / "DeepSeek-V4-Flash"
    model_path.parent.mkdir()
    subprocess.run(["cp", "-a", str(sim.model_path), str(model_path)], check=True)
    workdir = sim.root / f"orch {odd}"
    (workdir / "datasets").mkdir(parents=True)  # the benchmark's dataset, staged there as SimFleet does
    subprocess.run(
        ["cp", "-a", str(Path(sim.workdir) / "datasets" / "sharegpt.json"), str(workdir / "datasets")], check=True
    )
    odd_env = f"$(touch {absolute_canary}) `touch {canary}`; | & > * ~ 'q' \"d\" \\"
    tag = f"$(touch {absolute_canary});~*"

    document = yaml.safe_load(env.inventory.read_text())
    document["hosts"][sim.name].update(
        sglang_dir=str(sglang_dir),
        python=str(python_dir / "bin" / "python"),
        model_path=str(model_path),
        workdir=str(workdir),
        env={"ODD_VALUE": odd_env},
        tags=[tag, "plain"],
    )
    env.inventory.write_text(yaml.safe_dump(document))
    playbook = small_playbook(tmp_path / "playbooks")
    env.fleet.add_upstream_commit("Through hostile paths")  # type: ignore[attr-defined]

    from orchestrator.sandbox.processes import host_pids

    touches: list[str] = []
    argv_seen: dict[int, list[bytes]] = {}
    proc = subprocess.Popen(
        [*orch_base(env), "run", str(playbook), "--tag", tag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    while proc.poll() is None:  # watch the host's processes' argv until the campaign ends
        touches += touches_of(canary) + touches_of(str(absolute_canary))
        argv_seen.update((pid, argv_of(pid)) for pid in host_pids([sim.root]) if pid not in argv_seen)
        time.sleep(0.05)  # leave the CPU to the host (the canary files are the proof; this names a culprit)
    output = proc.communicate()[0].decode()
    assert proc.returncode == 0, output
    assert touches == []
    created = [p for p in (sim.root, tmp_path, Path.cwd(), Path(str(sim.root / "home"))) if list(p.rglob(f"{canary}*"))]
    assert created == [] and not absolute_canary.exists()
    assert not list(Path("/").glob(canary)) and not list(Path("/").glob(f"*/{canary}"))

    hs = StateStore(env.state).read().hosts[sim.name]
    assert hs.phase.value == "serving" and hs.server is not None and hs.server.verified
    assert hs.sglang is not None and hs.sglang.subject == "Through hostile paths"  # the odd checkout was pulled
    assert hs.tuning is not None
    [installed] = hs.tuning.installed.values()
    config = Path(installed.path)
    assert config.is_file() and str(config).startswith(f"{sglang_dir}/python/sglang/")  # in the odd checkout
    server_log = (workdir / "jobs" / hs.server.job_id / "log").read_text()
    assert f"Using configuration from {config} for W8A8 Block FP8 kernel." in server_log  # SGLang read it there
    server_pid = int((workdir / "jobs" / hs.server.job_id / "pid").read_text())
    tree = process_tree(server_pid)
    argvs = [argv_of(pid) for pid in tree]
    assert any(str(model_path).encode() in argv for argv in argvs)  # one argument, exactly the inventory's
    assert any(argv[1:3] == [b"-m", b"sglang.launch_server"] for argv in argvs)  # not pip's sh trampoline
    environs = [Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in tree]
    assert all(f"ODD_VALUE={odd_env}".encode() in e for e in environs)  # the server got it literally
    assert any(str(python_dir).encode() in b" ".join(a) for a in argv_seen.values())  # the odd python ran


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("workdir", "~/orch", "must be an absolute path on the host (got '~/orch'); orch quotes every path"),
        ("model_path", "/models/x\rDeepSeek", "holds a control character ('\\r'"),
        ("env", {"HF_HOME": "/cache\0/x"}, "holds a control character ('\\x00'"),
        ("tags", ["ok", "a\nb"], "holds a control character ('\\n'"),
    ],
    ids=["tilde", "CR-in-model-path", "NUL-in-env", "newline-in-tag"],
)
def test_a_value_orch_cannot_use_literally_stops_orch_run_before_any_connection(
    make_fleet: Callable[..., FleetEnv], key: str, value: object, message: str
) -> None:
    env = make_fleet(1)
    sim = env.fleet.hosts[0]  # type: ignore[attr-defined]
    document = yaml.safe_load(env.inventory.read_text())
    document["hosts"][sim.name][key] = value
    env.inventory.write_text(yaml.safe_dump(document))
    before = sim.accepted_connections()
    run = env.orch("run")
    assert run.returncode == 2, run.output
    where = "key 'env.HF_HOME'" if key == "env" else "key 'tags[1]'" if key == "tags" else f"key '{key}'"
    assert f"{env.inventory}: host '{sim.name}', {where}: {message}" in run.stderr, run.stderr
    assert "Traceback" not in run.output
    assert sim.accepted_connections() == before  # no host was contacted
    assert not (Path(sim.workdir) / "jobs").exists() and not database_path(env.state).exists()
