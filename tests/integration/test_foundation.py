"""Issue 2 end to end: the real `orch` CLI against simulated hosts over real sshd on loopback."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import yaml

from orchestrator.state_migration import database_path
from tests.conftest import FleetEnv, run_orch, write_fleet_inventory
from tests.integration.test_bastion import set_defaults
from tests.unit.test_state import document


def status_json(env: FleetEnv, *args: str) -> tuple[int, dict[str, dict]]:  # type: ignore[type-arg]
    run = env.orch("status", "--json", *args)
    doc = json.loads(run.stdout)
    return run.returncode, {h["name"]: h for h in doc["hosts"]}


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_status_reads_every_host_over_ssh(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(3)
    code, hosts = status_json(env)
    assert code == 0
    assert len(hosts) == 3
    for h in hosts.values():
        assert h["reachable"] is True and h["error"] is None
        assert h["phase"] == "new"
        assert len(h["gpus"]) == 8
        assert h["gpus"][0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert h["gpus"][0]["memory_total_mib"] > 90000
        assert h["sglang"]["branch"] == "main" and h["sglang"]["behind"] == 0
    table = env.orch("status")
    assert table.returncode == 0 and "sim-1" in table.stdout and "8×" in table.stdout


def test_status_reports_unreachable_host_without_blocking_others(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(3)
    env.fleet.hosts[1].stop_sshd()
    run = run_orch(
        "-i", str(env.inventory), "--state", str(env.state), "--connect-timeout", "3", "status", "--json", timeout=30
    )
    assert run.returncode == 3
    hosts = {h["name"]: h for h in json.loads(run.stdout)["hosts"]}
    down = env.fleet.hosts[1].name
    assert hosts[down]["reachable"] is False
    assert "connection refused" in hosts[down]["error"]
    assert all(h["reachable"] for name, h in hosts.items() if name != down)


def test_gpu_held_by_a_process_shows_in_status(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    holder = env.fleet.hosts[0].hold_gpu(3)
    _, hosts = status_json(env)
    (h,) = hosts.values()
    procs = h["gpus"][3]["processes"]
    assert [p["pid"] for p in procs] == [holder.pid]
    assert h["gpus"][3]["memory_used_mib"] > 0


def test_unknown_host_key_is_refused_then_trusted(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2, trust=False)
    first = env.fleet.hosts[0]
    code, hosts = status_json(env)
    assert code == 3
    assert "unknown host key" in hosts[first.name]["error"]
    assert "SHA256:" in hosts[first.name]["error"]
    trust = env.orch("trust", first.name)
    assert trust.returncode == 0, trust.output
    assert "trusted ssh-ed25519 SHA256:" in trust.stdout
    _, hosts = status_json(env)
    assert hosts[first.name]["reachable"] is True
    assert hosts[env.fleet.hosts[1].name]["reachable"] is False


def test_accept_new_host_keys_records_the_key(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1, trust=False)
    run = env.orch("--accept-new-host-keys", "status")
    assert run.returncode == 0, run.output
    assert "trusted new host key" in run.stderr
    assert env.orch("status").returncode == 0  # recorded: no flag needed any more


def test_changed_host_key_is_always_refused(make_fleet, isolated_env: Path) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1, trust=False)
    host = env.fleet.hosts[0]
    other = Path(isolated_env / "other_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = other.with_suffix(".pub").read_text().split()[:2]
    known = isolated_env / ".ssh" / "known_hosts"
    known.parent.mkdir(mode=0o700, exist_ok=True)
    known.write_text(f"[{host.address}]:{host.ssh_port} {' '.join(wrong)}\n")
    for args in (("status",), ("--accept-new-host-keys", "status")):
        run = env.orch(*args)
        assert run.returncode == 3
        assert "HOST KEY CHANGED" in run.stdout + run.stderr
    assert "HOST KEY CHANGED" in env.orch("trust", host.name).stderr


def test_pull_fast_forwards_and_lists_new_commits(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    for subject in ("Add A", "Add B"):
        env.fleet.add_upstream_commit(subject)
    pins = (env.fleet.hosts[0].sglang_dir / "python" / "pyproject.toml").read_text() + "# sglang-kernel bumped\n"
    env.fleet.add_upstream_commit("Fix C", {"python/pyproject.toml": pins})
    run = env.orch("pull")
    assert run.returncode == 0, run.output
    assert run.stdout.count("3 new commits") == 2
    for host in env.fleet.hosts:
        assert (
            f"{host.name}: python/pyproject.toml changed (the package's pins): an install is needed before serving: "
            f"`orch pull --install --host {host.name}`"
        ) in run.stdout
    assert "Fix C" in run.stdout and "Add A" in run.stdout
    code, hosts = status_json(env)
    assert code == 0
    assert all(h["phase"] == "pulled" and h["sglang"]["subject"] == "Fix C" for h in hosts.values())
    again = env.orch("pull")
    assert again.returncode == 0 and again.stdout.count("already up to date") == 2


def test_status_counts_commits_behind_as_last_fetched(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    host = env.fleet.hosts[0]
    env.fleet.add_upstream_commit("Upstream moves")
    git(host.sglang_dir, "fetch", "-q", "origin")
    _, hosts = status_json(env)
    assert hosts[host.name]["sglang"]["behind"] == 1


def test_pull_refuses_dirty_tree_and_changes_nothing(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    dirty, clean = env.fleet.hosts
    env.fleet.add_upstream_commit("New kernel")
    before = git(dirty.sglang_dir, "rev-parse", "HEAD")
    (dirty.sglang_dir / "python" / "sglang" / "__init__.py").write_text("# local edit\n")
    run = env.orch("pull")
    assert run.returncode == 3
    assert f"{dirty.name}: {dirty.sglang_dir} has uncommitted changes" in run.stderr
    assert "python/sglang/__init__.py" in run.stderr
    assert git(dirty.sglang_dir, "rev-parse", "HEAD") == before
    assert f"{clean.name}: " in run.stdout and "1 new commit" in run.stdout


def test_pull_on_a_host_without_its_checkout_is_a_clear_error_not_a_traceback(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    moved = host.sglang_dir.with_name("sglang-moved")
    host.sglang_dir.rename(moved)
    run = env.orch("pull")
    assert run.returncode == 3, run.output
    assert f"{host.name}: SGLang checkout {host.sglang_dir}:" in run.stderr
    assert "check `sglang_dir`" in run.stderr and "Traceback" not in run.stderr
    moved.rename(host.sglang_dir)


def test_pull_refuses_diverged_branch(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    host = env.fleet.hosts[0]
    env.fleet.add_upstream_commit("Upstream change")
    git(host.sglang_dir, "commit", "-q", "--allow-empty", "-m", "local hack")
    before = git(host.sglang_dir, "rev-parse", "HEAD")
    run = env.orch("pull")
    assert run.returncode == 3
    assert "diverged from origin/main (1 local, 1 upstream commits)" in run.stderr
    assert git(host.sglang_dir, "rev-parse", "HEAD") == before
    set_defaults(env, upstream="origin/mian")  # a typo in the inventory
    typo = env.orch("pull")
    assert typo.returncode == 3, typo.output
    assert f"{host.name}: upstream origin/mian is not a commit in {host.sglang_dir} after fetching origin" in (
        typo.stderr
    )
    assert "check `upstream`" in typo.stderr and "Traceback" not in typo.output
    assert git(host.sglang_dir, "rev-parse", "HEAD") == before


def test_pull_dry_run_prints_commands_and_changes_nothing(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    host = env.fleet.hosts[0]
    env.fleet.add_upstream_commit("Not yet")
    before = git(host.sglang_dir, "rev-parse", "HEAD")
    run = env.orch("pull", "--dry-run")
    assert run.returncode == 0
    assert f"git -C {host.sglang_dir} merge --ff-only --quiet origin/main" in run.stdout
    assert git(host.sglang_dir, "rev-parse", "HEAD") == before
    assert not database_path(env.state).exists()


def test_hostile_inventory_paths_are_used_literally(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    host = env.fleet.hosts[0]
    canary = f"pwned-{uuid.uuid4().hex[:8]}"  # relative: a shell would create it in the login directory
    odd = host.root / f"sg lang; touch {canary}; $(touch {canary}) 'q' \"d\""
    subprocess.run(["cp", "-a", str(host.sglang_dir), str(odd)], check=True)
    inv = yaml.safe_load(env.inventory.read_text())
    inv["hosts"][host.name]["sglang_dir"] = str(odd)
    inv["hosts"][host.name]["workdir"] = str(host.root / f"work `touch {canary}`")
    env.inventory.write_text(yaml.safe_dump(inv))
    env.fleet.add_upstream_commit("Through odd paths")
    run = env.orch("pull")
    assert run.returncode == 0, run.output
    assert git(odd, "log", "-1", "--format=%s") == "Through odd paths"
    assert env.orch("jobs").returncode == 0
    assert not list(Path("/").glob(f"*/{canary}")) and not list(Path("/").glob(canary))


def test_one_ssh_connection_per_host_per_invocation(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    env.fleet.add_upstream_commit("Count me")
    before = [h.accepted_connections() for h in env.fleet.hosts]
    assert env.orch("pull").returncode == 0  # many remote commands per host
    after = [h.accepted_connections() for h in env.fleet.hosts]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]


def test_concurrent_orch_runs_lose_no_state_update(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(2)
    a, b = (h.name for h in env.fleet.hosts)
    env.fleet.add_upstream_commit("Both")
    base = env.argv()
    commands = [["pull", "--host", a], ["pull", "--host", b], *[["status", "--host", n] for n in (a, b, a, b)]]
    procs = [subprocess.Popen([*base, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    for p in procs:
        p.stdout.close()  # type: ignore[union-attr]
        p.stderr.close()  # type: ignore[union-attr]
    state = document(env.state)
    assert {state["hosts"][a]["phase"], state["hosts"][b]["phase"]} == {"pulled"}
    assert all(state["hosts"][n]["sglang"]["subject"] == "Both" for n in (a, b))


def test_corrupted_state_file_is_a_clear_error(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    env.state.parent.mkdir(parents=True, exist_ok=True)
    env.state.write_text('{"schema_version": 1, "hosts": {')
    run = env.orch("status")
    assert run.returncode == 4
    assert str(env.state) in run.stderr
    assert env.state.read_text() == '{"schema_version": 1, "hosts": {'


def test_bad_inventory_is_exit_2_naming_file_host_and_key(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  gpu-1:\n    address: 127.0.0.1\n    prot: 22\n")
    run = run_orch("-i", str(inv), "status")
    assert run.returncode == 2
    assert f"{inv}: host 'gpu-1': unknown key 'prot'" in run.stderr
    assert "Traceback" not in run.stderr


def test_unknown_host_is_exit_2_listing_known_names() -> None:
    repo_inventory = Path(__file__).resolve().parents[2] / "hosts.yaml"
    run = run_orch("-i", str(repo_inventory), "status", "--host", "10.9.9.9")  # rejected before any connection
    assert run.returncode == 2
    assert "unknown host '10.9.9.9'" in run.stderr and "blackwell-1, blackwell-2" in run.stderr


def test_local_transport_runs_the_same_commands(tmp_path: Path) -> None:
    from orchestrator.sandbox import SimFleet

    with SimFleet(tmp_path / "fleet", n_hosts=1, transport="local") as fleet:
        inventory = write_fleet_inventory(fleet, tmp_path / "hosts.yaml")
        run = run_orch("-i", str(inventory), "status", "--json")
        assert run.returncode == 0, run.output
        (host,) = json.loads(run.stdout)["hosts"]
        assert host["reachable"] and len(host["gpus"]) == 8


def test_pull_install_runs_pip_with_the_hosts_python(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = make_fleet(1)
    (host,) = env.fleet.hosts
    env.fleet.add_upstream_commit("Needs a reinstall")
    run = env.orch("pull", "--install", timeout=600)
    assert run.returncode == 0, run.output
    assert f"installed with `pip install -e python` ({host.python})" in run.stdout
    site = subprocess.run([str(host.python), "-m", "pip", "show", "sglang"], capture_output=True, text=True)
    assert "Editable project location: " + str(host.sglang_dir / "python") in site.stdout
