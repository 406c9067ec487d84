"""Issue 13 (secrets leak): a token in the inventory's ``env`` reaches the host's commands and jobs
through their environment, never through a command line (which every user sees in ``ps``), and is
not printed by ``-vv``, ``--dry-run`` or written to the state file."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator import jobs
from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.transport.ssh import ConnectOptions
from tests.conftest import FleetEnv

TOKEN = "hf_SeCrEtToKeN0123456789abcdef"
API_KEY = "sk-OpEnAiKeY9876543210"
SECRETS = (TOKEN, API_KEY)
# A value the shell must not evaluate, nor split, nor strip.
ODD = " $(touch pwned) `id` 'q' \"d\" \\ "


def leaked_cmdlines() -> list[str]:
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
        if any(s in text for s in SECRETS):
            found.append(f"{pid}: {text}")
    return found


@contextmanager
def watching_cmdlines() -> Iterator[list[str]]:
    """Scan all command lines over and over while the block runs; the list gets every sighting."""
    sightings: list[str] = []
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            sightings.extend(leaked_cmdlines())

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
    assert sightings == []
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
    assert sightings == []
    for path in env.state.parent.glob("*"):
        assert not any(s.encode() in path.read_bytes() for s in SECRETS), path
