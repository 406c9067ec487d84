"""bench/peers.py's own parts (issue 11 §7): when a host counts as answered, the parallel-ssh script's exit
status, the inventories it writes for Ansible and pyinfra, the rotation of the interleaving, the table."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from orchestrator.facts import probe
from orchestrator.sandbox.host import SimHost

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "peers.py"


def load_peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


peers = load_peers()


def probe_output(*statuses: int) -> str:
    """What the real probe script prints for sections git, gpus, apps ending with ``statuses``."""
    sections = [
        (name, ["sh", "-c", f"echo {name}; exit {rc}"]) for name, rc in zip(peers.SECTIONS, statuses, strict=True)
    ]
    return subprocess.run(probe.probe_argv(sections), capture_output=True, text=True, check=True).stdout


def hosts(tmp_path: Path, n: int) -> list[SimHost]:
    return [SimHost(f"sim-{i}", f"127.0.0.{i}", 2200 + i, 30000 + i, tmp_path / f"sim-{i}") for i in range(1, n + 1)]


def test_a_host_counts_as_answered_only_when_every_section_ended_with_status_0() -> None:
    whole = probe_output(0, 0, 0)
    assert peers.answered(whole) == 1
    assert peers.answered(whole + whole) == 2
    assert peers.answered(whole + probe_output(0, 0, 1)) == 1
    assert peers.answered("", whole) == 1  # pyinfra prints what hosts print on its stderr
    assert peers.answered(whole[: whole.index("end apps")]) == 0


def test_orch_counts_hosts_it_reached_with_a_checkout_and_gpus() -> None:
    reached = '{"reachable": true, "sglang": {"commit": "abc"}, "gpus": [{"index": 0}]}'
    unreachable = '{"reachable": false, "sglang": null, "gpus": []}'
    assert peers.orch_answered(f'{{"hosts": [{reached}, {unreachable}, {reached}]}}') == 2


def test_parallel_ssh_script_fails_when_any_ssh_fails(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_ssh = bin_dir / "ssh"  # a stand-in ssh: fails for port 2202, prints its last argument otherwise
    fake_ssh.write_text(
        '#!/bin/sh\ncase " $* " in *" -p 2202 "*) exit 255;; esac\nfor a; do last=$a; done\necho "$last"\n'
    )
    fake_ssh.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(n: int) -> subprocess.CompletedProcess[str]:
        script = peers.openssh_script(hosts(tmp_path, n), ["-F", "/dev/null"], "root", "echo 'it''s'")
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)

    one = run(1)
    assert (one.returncode, one.stdout) == (0, "echo 'it''s'\n")
    assert run(3).returncode == 1


def test_pyinfra_inventory_is_python_naming_each_host_with_strict_host_key_checking(tmp_path: Path) -> None:
    class Fleet:
        client_key = tmp_path / "id"
        known_hosts = tmp_path / "known_hosts"

    all_hosts = hosts(tmp_path, 2)
    namespace: dict[str, object] = {}
    exec(peers.pyinfra_inventory({"n1": all_hosts[:1], "n2": all_hosts}, "root", Fleet), namespace)
    assert [name for name, _ in namespace["n2"]] == ["sim-1", "sim-2"]  # type: ignore[attr-defined]
    _, data = namespace["n1"][0]  # type: ignore[index]
    assert data == {
        "ssh_user": "root",
        "ssh_key": str(tmp_path / "id"),
        "ssh_known_hosts_file": str(tmp_path / "known_hosts"),
        "ssh_strict_host_key_checking": "yes",
        "ssh_hostname": "127.0.0.1",
        "ssh_port": 2201,
    }


def test_ansible_inventory_gives_each_host_its_address_port_and_interpreter(tmp_path: Path) -> None:
    text = peers.ansible_inventory({"n2": hosts(tmp_path, 2)}, "root", tmp_path / "id")
    lines = text.splitlines()
    assert lines[0] == "[n2]"
    assert (
        lines[2]
        == f"sim-2 ansible_host=127.0.0.2 ansible_port=2202 ansible_python_interpreter={tmp_path}/sim-2/venv/bin/python"
    )
    assert lines[-2:] == ["ansible_user=root", f"ansible_ssh_private_key_file={tmp_path / 'id'}"]


def test_rounds_rotate_the_order_so_no_tool_always_runs_first() -> None:
    tools = list(peers.TOOLS)
    firsts = {peers.rotated(tools, r)[0] for r in range(len(tools))}
    assert firsts == set(tools)
    assert sorted(peers.rotated(tools, 3)) == sorted(tools)


def test_markdown_table_has_a_row_per_tool_with_ratios_to_orch_and_the_load() -> None:
    results = {
        1: {
            "orch": {"wall_s": 1.0, "cpu_s": 0.4, "x_orch": 1.0},
            "openssh": {"wall_s": 0.5, "cpu_s": 0.1, "x_orch": 0.5},
        },
        8: {
            "orch": {"wall_s": 2.0, "cpu_s": 0.8, "x_orch": 1.0},
            "openssh": {"wall_s": 2.5, "cpu_s": 0.3, "x_orch": 1.25},
        },
    }
    report = {
        "command": "python bench/peers.py",
        "date": "today",
        "runs": 3,
        "cores": 2,
        "results": results,
        "loadavg": {1: [1.0, 2.0, 3.0], 8: [4.0, 5.0, 6.0]},
        "versions": {"orch": "0.1.0"},
        "png_name": "peers.png",
    }
    text = peers.markdown(report)
    assert "| tool | 1 host | 8 hosts |" in text
    assert "| parallel OpenSSH | 0.50 s (0.50×) · CPU 0.10 s | 2.50 s (1.25×) · CPU 0.30 s |" in text
    assert "orch / parallel OpenSSH (wall): 1: 2.00 · 8: 0.80." in text
    assert "1 host: 1.00 / 2.00 / 3.00 · 8 hosts: 4.00 / 5.00 / 6.00" in text
