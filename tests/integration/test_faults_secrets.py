"""Issue 13 (secrets leak): a token in the inventory's ``env`` reaches the host's commands and jobs
through their environment, never through a command line (which every user sees in ``ps``), and is
not printed by ``-vv``, ``--dry-run`` or written to the state file."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator import jobs
from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.store import StateStore
from orchestrator.transport.ssh import ConnectOptions
from tests.conftest import FleetEnv, OrchRun, run_orch, write_fleet_inventory

TOKEN = "hf_SeCrEtToKeN0123456789abcdef"
API_KEY = "sk-OpEnAiKeY9876543210"
SECRETS = (TOKEN, API_KEY)
# A value the shell must not evaluate, nor split, nor strip.
ODD = " $(touch pwned) `id` 'q' \"d\" \\ "


def leaked_cmdlines(secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """Every process command line on this machine (the simulated hosts are local) holding a secret."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        text = raw.replace(b"\0", b" ").decode(errors="replace")
        if any(s in text for s in secrets):
            found.append(f"{pid}: {text}")
    return found


@dataclass
class Watch:
    found: list[str] = field(default_factory=list)  # every sighting: "pid: command line"
    scans: int = 0  # how many times every command line was read


@contextmanager
def watching_cmdlines(secrets: tuple[str, ...] = SECRETS) -> Iterator[Watch]:
    """Scan all command lines over and over while the block runs; ``found`` gets every sighting."""
    sightings = Watch()
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            sightings.found.extend(leaked_cmdlines(secrets))
            sightings.scans += 1
            time.sleep(0.01)  # leave the CPU to the hosts: a remote command lives longer than this

    thread = threading.Thread(target=scan, daemon=True)
    thread.start()
    try:
        yield sightings
    finally:
        done.set()
        thread.join()


def secret_fleet(make_fleet) -> FleetEnv:  # type: ignore[no-untyped-def]
    return make_fleet(1, env={"HF_TOKEN": TOKEN, "OPENAI_API_KEY": API_KEY, "ODD": ODD})  # type: ignore[no-any-return]


def test_a_job_gets_the_inventory_token_in_its_environment_never_on_a_command_line(make_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = secret_fleet(make_fleet)
    out = tmp_path / "seen"
    script = 'printf "%s|%s|%s" "$HF_TOKEN" "$OPENAI_API_KEY" "$ODD" > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 60'
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    with watching_cmdlines() as sightings, Fleet([host], ConnectOptions()) as fleet:
        runner = fleet.runner(host)
        started = jobs.start(
            runner, host.workdir, jobs.JobSpec("test", "t.secret", ["sh", "-c", script, "job", str(out)])
        )
        echoed = runner.run(["sh", "-c", 'cat; printf "[%s]" "$ODD"'], stdin="rest of stdin\n", check=True)
        while not out.exists():  # the job has started and read its environment
            assert jobs.find(runner, host.workdir, started.job_id).running
        assert leaked_cmdlines() == []  # while the job runs
        environ = Path(f"/proc/{started.pid}/environ").read_bytes().split(b"\0")
        jobs.stop(runner, jobs.find(runner, host.workdir, started.job_id), grace_seconds=5)
    assert out.read_text() == f"{TOKEN}|{API_KEY}|{ODD}"  # literally: no shell evaluation, nothing stripped
    assert f"HF_TOKEN={TOKEN}".encode() in environ  # the job's wrapper has it too, in its environment
    assert echoed.stdout == f"rest of stdin\n[{ODD}]"  # a command's own stdin still arrives whole
    assert sightings.found == []
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_vv_status_and_dry_run_never_print_the_token_nor_the_state_file_keep_it(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env = secret_fleet(make_fleet)
    with watching_cmdlines() as sightings:
        status = env.orch("-vv", "status")
        dry = env.orch("-vv", "run", "--dry-run")
    assert status.returncode == 0, status.output
    assert dry.returncode == 0, dry.output
    for run in (status, dry):
        assert not any(s in run.output for s in SECRETS), run.output
    assert "HF_TOKEN" in status.output  # the command lines are still logged, with the names only
    assert sightings.found == []
    for path in (p for p in env.state.parent.rglob("*") if p.is_file()):
        assert not any(s.encode() in path.read_bytes() for s in SECRETS), path


# --- a whole campaign ---------------------------------------------------------------------------------

PASSWORD = "Pa55w0rd-c4mpaign-only"
CAMPAIGN_SECRETS = (TOKEN, API_KEY, PASSWORD)
FAST = {"tune_seconds_per_unit": 0.02, "startup_seconds": 0.3}


def small_playbook(directory: Path) -> Path:
    """The packaged DeepSeek-V4-Flash playbook cut down to one shape, two batch sizes, a tiny benchmark."""
    from orchestrator.recipe import PACKAGED_PLAYBOOKS

    document = yaml.safe_load((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    document["tuning"] = {"shapes": [{"N": 1536, "K": 4096}], "batch_sizes": [1, 2]}  # one the server looks up
    document["bench"] = {"input_len": 32, "output_len": 32, "num_prompts": 4, "max_concurrency": 2}
    document["health_timeout"] = 120
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "small.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def sightings_in(places: dict[str, bytes]) -> list[str]:
    return [
        f"{where}: holds {s[:6]}..." for where, data in places.items() for s in CAMPAIGN_SECRETS if s.encode() in data
    ]


def test_a_whole_campaign_keeps_inventory_secrets_out_of_every_command_line_log_file_and_report(
    tmp_path: Path,
) -> None:
    from orchestrator.sandbox import SimFleet

    with SimFleet(tmp_path / "fleet", n_hosts=1, sshd_log_level="DEBUG3") as fleet:
        (sim,) = fleet.hosts
        sim.set_knobs(**FAST)
        secrets_env = {"HF_TOKEN": TOKEN, "OPENAI_API_KEY": API_KEY, "DB_PASSWORD": PASSWORD}
        inventory = write_fleet_inventory(fleet, tmp_path / "hosts.yaml", env=secrets_env)
        state = tmp_path / "state" / "state.json"
        playbook = small_playbook(tmp_path / "playbooks")
        fleet.add_upstream_commit("A commit to pull")

        def orch(*args: str) -> OrchRun:
            return run_orch("-i", str(inventory), "--state", str(state), *args, timeout=600)

        bad = yaml.safe_load(playbook.read_text())
        bad["server_args"]["api-key"] = API_KEY
        bad_playbook = playbook.with_name("with-a-key.yaml")
        bad_playbook.write_text(yaml.safe_dump(bad))
        refused = orch("run", str(bad_playbook))  # a secret in a playbook: refused before any host
        assert refused.returncode == 2, refused.output
        assert "'api-key' looks like a secret" in refused.stderr and API_KEY not in refused.output

        with watching_cmdlines(CAMPAIGN_SECRETS) as sightings:
            run = orch("-vv", "run", str(playbook))
            dry = orch("-vv", "run", str(playbook), "--dry-run")
            status = orch("-vv", "status")
        assert run.returncode == 0, run.output
        assert dry.returncode == 0 and status.returncode == 0, dry.output + status.output
        assert sightings.found == [], sightings.found[:3]

        hs = StateStore(state).read().hosts[sim.name]
        assert hs.phase.value == "serving" and hs.benchmarks
        server_pid = int((sim.workdir / "jobs" / hs.server.job_id / "pid").read_text())  # type: ignore[union-attr]
        server_environs = [Path(f"/proc/{pid}/environ").read_bytes() for pid in process_tree(server_pid)]
        assert len(server_environs) >= 2  # the job's wrapper and the server it runs
        assert all(f"HF_TOKEN={TOKEN}".encode() in e.split(b"\0") for e in server_environs)  # it still gets them
        assert all(f"DB_PASSWORD={PASSWORD}".encode() in e.split(b"\0") for e in server_environs)

        reports = [orch("report", "--format", fmt, "--out", str(tmp_path / f"report-{fmt}")) for fmt in ("md", "html")]
        assert [r.returncode for r in reports] == [0, 0], [r.output for r in reports]
        places = {
            f"orch {name} output": r.output.encode() for name, r in (("run", run), ("dry", dry), ("status", status))
        }
        files = [p for p in state.parent.rglob("*") if p.is_file()] + [sim.sshd_log]  # each host file, .bak, log
        files += [p for p in (sim.workdir).rglob("*") if p.is_file()]  # every job's log and files
        files += [p for fmt in ("md", "html") for p in (tmp_path / f"report-{fmt}").rglob("*") if p.is_file()]
        places.update((str(p), p.read_bytes()) for p in files)
        assert sightings_in(places) == []
        assert b"debug3: " in sim.sshd_log.read_bytes()  # sshd logged every channel request it got
        print(
            f"secrets campaign: {len(sightings.found)} sightings in {sightings.scans} scans of every command line; "
            f"0 in {len(places)} places after it ({len(files)} files)"
        )
