"""The replacement check (``facts.replacement``): what stops a new server from starting, read in one round
trip before any stop. Table tests of the parser and of the problems, and the probe run for real on this
machine (a local shell: its model directory, a listener on a port, the workdir, a Python's sglang)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.facts import replacement as r
from orchestrator.facts.probe import probe_argv

HOST = "gpu-1"


def needs(**changes: object) -> r.Needs:
    base: dict[str, object] = dict(
        host=HOST,
        model_path="/models/M",
        port=30000,
        workdir="/root/.orch",
        python="/venv/bin/python",
        sglang_dir="/root/sglang",
        gpus=list(range(8)),
        shown_gpus=list(range(8)),
        own_session=None,
    )
    return r.Needs(**{**base, **changes})  # type: ignore[arg-type]


def answer(**sections: tuple[int, str]) -> str:
    """A probe answer with the given sections (name -> (exit status, output)); the others healthy."""
    healthy = {
        "model": (0, "dir ok\nconfig ok\nweights index"),
        "port": (0, "free"),
        "workdir": (0, "checked /root/.orch\nwritable\nfree 5000000"),
        "sglang": (0, "want /root/sglang/python/sglang\nfile /root/sglang/python/sglang\nversion 0.5.23"),
    }
    out = []
    for name, (status, text) in {**healthy, **sections}.items():
        out += [f"@@orch-section begin {name}", text, "", f"@@orch-section end {name} {status}"]
    return "\n".join(out) + "\n"


def obstacles(stdout: str, **changes: object) -> list[str]:
    found = r.parse(stdout)
    return [str(o) for o in r.unanswered_problems(found) + r.problems(found, needs(**changes))]


@pytest.mark.parametrize(
    ("sections", "changes", "expected"),
    [
        ({}, {}, []),
        (
            {"model": (0, "dir missing")},
            {},
            [
                "model directory /models/M is missing (a dropped mount?) (mount or copy the model there, or fix "
                "`model_path` for gpu-1)"
            ],
        ),
        (
            {"model": (0, "dir ok\nconfig missing\nweights shards 0")},
            {},
            [
                "/models/M/config.json is missing (mount or copy the model there, or fix `model_path` for gpu-1)",
                "no weights in /models/M (no model.safetensors.index.json, no *.safetensors) (mount or copy the "
                "model there, or fix `model_path` for gpu-1)",
            ],
        ),
        ({"model": (0, "dir ok\nconfig ok\nweights shards 46")}, {}, []),
        (
            {"model": (0, 'dir ok\nconfig ok\narchs "architectures": ["Qwen3MoeForCausalLM"\nweights index')},
            {"architecture": "DeepseekV4ForCausalLM"},
            [
                "the model in /models/M is Qwen3MoeForCausalLM (its config.json), not the recipe's "
                "DeepseekV4ForCausalLM (fix `model_path` for gpu-1, or serve that model with a playbook for it)"
            ],
        ),
        (
            {"model": (0, 'dir ok\nconfig ok\narchs "architectures":["A", "DeepseekV4ForCausalLM"\nweights index')},
            {"architecture": "DeepseekV4ForCausalLM"},
            [],
        ),
        ({"model": (0, "dir ok\nconfig ok\narchs \nweights index")}, {"architecture": "DeepseekV4ForCausalLM"}, []),
        (
            {},
            {"shown_gpus": list(range(7))},
            [
                "the server needs 8 GPUs (0-7) but nvidia-smi shows 7 (no GPU 7) (check the host's GPUs with "
                "nvidia-smi, or lower the recipe's tp/dp)"
            ],
        ),
        ({}, {"shown_gpus": None}, []),  # not read: nothing to compare
        (
            {"port": (0, "listener 0100007F 4242 4242 python3\nlistener 0100007F 4242 4242 python3")},
            {"own_session": 999},
            [
                "port 30000 is held by pid 4242 (python3) on 127.0.0.1, not by orch's server (free the port (orch "
                "never kills a process it did not start) or change `server_port` for gpu-1)"
            ],
        ),
        ({"port": (0, "listener 0100007F 5001 999 sglang::scheduler")}, {"own_session": 999}, []),  # orch's server
        (
            {"port": (0, "listener 0100007F - - -")},
            {},
            [
                "port 30000 is held by a process orch cannot see on 127.0.0.1, not by orch's server (free the port "
                "(orch never kills a process it did not start) or change `server_port` for gpu-1)"
            ],
        ),
        (  # another loopback address: the same port number, not the same port (issue: a rollback killed)
            {"port": (0, "listener 028E9D7F 23088 23088 sshd")},
            {"bind_address": "127.0.0.1"},
            [],
        ),
        (
            {"port": (0, "listener 028E9D7F 23088 23088 sshd")},
            {"bind_address": "0.0.0.0"},
            [
                "port 30000 is held by pid 23088 (sshd) on 127.157.142.2, not by orch's server (free the port "
                "(orch never kills a process it did not start) or change `server_port` for gpu-1)"
            ],
        ),
        (
            {"workdir": (0, "checked /root/.orch\nwritable\nfree 2048")},
            {},
            [
                "no space left for a job in /root/.orch: 2 MiB free (a job needs 100) (free space on /root/.orch's "
                "filesystem, or point `workdir` for gpu-1 elsewhere)"
            ],
        ),
        (
            {"workdir": (0, "checked /root\nreadonly mktemp: Read-only file system\nfree 9999999")},
            {},
            [
                "workdir /root is not writable: mktemp: Read-only file system (free space on /root's filesystem, "
                "or point `workdir` for gpu-1 elsewhere)"
            ],
        ),
        (
            {
                "sglang": (
                    0,
                    "want /root/sglang/python/sglang\nfile /usr/lib/sglang\nversion 0.5.9",
                )
            },
            {},
            [
                "/venv/bin/python imports sglang from /usr/lib/sglang, not from "
                "/root/sglang/python/sglang (sglang_dir) (`orch pull --install --host gpu-1` installs the "
                "checkout into /venv/bin/python)"
            ],
        ),
        (
            {"sglang": (0, "want /root/sglang/python/sglang\nerror ModuleNotFoundError: No module named 'sglang'")},
            {},
            [
                "/venv/bin/python cannot import sglang: ModuleNotFoundError: No module named 'sglang' (`orch pull "
                "--install --host gpu-1` installs the checkout into /venv/bin/python)"
            ],
        ),
        (
            {"model": (124, "")},
            {},
            ["could not check model: timed out (check the model's mount on the host)"],
        ),
        (
            {"sglang": (127, "timeout: failed to run command '/venv/bin/python': No such file or directory")},
            {},
            [
                "could not check sglang: exit 127: timeout: failed to run command '/venv/bin/python': No such file "
                "or directory (check `python` for the host in the inventory)"
            ],
        ),
    ],
)
def test_what_stops_a_new_server_from_starting(
    sections: dict[str, tuple[int, str]], changes: dict[str, object], expected: list[str]
) -> None:
    assert obstacles(answer(**sections), **changes) == expected


def test_a_section_cut_short_is_not_a_pass() -> None:
    cut = answer().split("@@orch-section begin sglang")[0]
    assert obstacles(cut) == ["could not check sglang: no answer (check `python` for the host in the inventory)"]


def test_the_sglang_import_is_read_with_its_version() -> None:
    found = r.parse(answer())
    assert found.sglang == r.SGLangImport("/root/sglang/python/sglang", "/root/sglang/python/sglang", "0.5.23", None)
    assert found.sglang.editable


def test_the_probe_is_one_command_of_five_sections() -> None:
    argv = r.probe_argv("/models/M", 30000, "/root/.orch", "/venv/bin/python", "/root/sglang")
    assert argv == probe_argv(r.sections("/models/M", 30000, "/root/.orch", "/venv/bin/python", "/root/sglang"))
    sections = [name for name, _ in r.sections("/m", 1, "/w", "/p", "/s")]
    assert sections == ["model", "port", "workdir", "sglang", "net"]


NET = {"net": (0, "eth0\nens1f0np0\nlo")}
NO_IFACE = "no network interface {} for {} (the host has eth0, ens1f0np0, lo): the rank would fail to start (set "
FIX = "the `network_interface` of gpu-1's group in hosts.yaml to one of its interfaces)"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),  # a host alone: its interfaces are not its launch's business
        ({"NCCL_SOCKET_IFNAME": "ens1f0np0", "GLOO_SOCKET_IFNAME": "ens1f0np0"}, []),
        ({"NCCL_SOCKET_IFNAME": "ens1f0"}, []),  # NCCL: a prefix
        ({"NCCL_SOCKET_IFNAME": "eth9,ens"}, []),  # NCCL: any of them
        ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, []),  # NCCL: all but these
        ({"NCCL_SOCKET_IFNAME": "=ens1f0"}, [NO_IFACE.format("ens1f0", "NCCL_SOCKET_IFNAME") + FIX]),
        ({"GLOO_SOCKET_IFNAME": "ens1f0"}, [NO_IFACE.format("ens1f0", "GLOO_SOCKET_IFNAME") + FIX]),  # Gloo: exact
        ({"GLOO_SOCKET_IFNAME": "^docker,lo"}, [NO_IFACE.format("^docker", "GLOO_SOCKET_IFNAME") + FIX]),
        (
            {"NCCL_SOCKET_IFNAME": "eth9", "GLOO_SOCKET_IFNAME": "eth9"},  # a typo: said once, for both
            [NO_IFACE.format("eth9", "NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME") + FIX],
        ),
    ],
)
def test_a_groups_rank_needs_the_network_interface_its_launch_names(env: dict[str, str], expected: list[str]) -> None:
    """A typo in a group's ``network_interface`` once stopped every rank's server, and the new ranks then
    failed at NCCL's or Gloo's start."""
    assert obstacles(answer(**NET), interface_env=env) == expected


def test_interfaces_not_listed_stop_only_a_groups_rank() -> None:
    failed = answer(net=(2, "ls: cannot access '/sys/class/net': No such file or directory"))
    assert obstacles(failed) == []
    assert obstacles(failed, interface_env={"NCCL_SOCKET_IFNAME": "lo"}) == [
        "could not list the host's network interfaces (/sys/class/net) (set " + FIX
    ]


@pytest.mark.parametrize(
    ("written", "address"),
    [
        ("0100007F", "127.0.0.1"),
        ("028E9D7F", "127.157.142.2"),
        ("00000000", "0.0.0.0"),
        ("00000000000000000000000000000000", "::"),
        ("00000000000000000000000001000000", "::1"),
        ("0000000000000000FFFF00000100007F", "::ffff:7f00:1"),  # IPv4-mapped: ``holding`` reads it as 127.0.0.1
        ("B80D0120000000000000000001000000", "2001:db8::1"),
        ("zz", None),
    ],
)
def test_a_listeners_address_is_read_as_proc_net_tcp_writes_it(written: str, address: str | None) -> None:
    assert r.proc_net_address(written) == address


@pytest.mark.parametrize(
    ("listening", "bound", "holds"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.157.142.2", "127.0.0.1", False),  # the same number on another address: another port
        ("0.0.0.0", "127.0.0.1", True),  # a wildcard listener holds every address
        ("::", "127.0.0.1", True),  # an IPv6 wildcard takes IPv4 too (unless v6only, which /proc does not say)
        ("127.157.142.2", "0.0.0.0", True),  # a wildcard server needs every address free
        ("127.157.142.2", "::", True),
        ("::1", "127.0.0.1", False),
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "::ffff:127.0.0.1", True),
        (None, "127.0.0.1", True),  # where it listens not read: it may be in the way
        ("127.157.142.2", "localhost", True),  # a name: where it binds is not known here
        ("127.157.142.2", None, True),
    ],
)
def test_only_a_listener_on_the_servers_address_or_a_wildcard_holds_its_port(
    listening: str | None, bound: str | None, holds: bool
) -> None:
    listener = r.Listener(23088, 23088, "sshd", listening)
    assert r.holding([listener], bound) == ([listener] if holds else [])


# --- the probe run for real on this machine ------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[int, int]]:
    """A socket this test process listens on: (port, this process's pid)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1], os.getpid()


def run_probe(model: Path, port: int, workdir: Path, python: str, sglang_dir: Path) -> r.HostFacts:
    argv = r.probe_argv(str(model), port, str(workdir), python, str(sglang_dir))
    return r.parse(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)


def test_the_probe_reads_a_real_host(tmp_path: Path, listener: tuple[int, int]) -> None:
    port, pid = listener
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{\n  "architectures": [\n    "DeepseekV4ForCausalLM"\n  ],\n  "x": [1]\n}')
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    sglang_dir = tmp_path / "sglang"
    (sglang_dir / "python" / "sglang").mkdir(parents=True)
    (sglang_dir / "python" / "sglang" / "__init__.py").write_text("__version__ = '0.5.23'\n")
    python = tmp_path / "python"  # imports sglang from the checkout, as an editable install does
    python.write_text(f'#!/bin/sh\nPYTHONPATH={sglang_dir}/python exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    found = run_probe(model, port, tmp_path / "orch" / "work", str(python), sglang_dir)
    assert (found.model_dir, found.model_config, found.weights) == (True, True, "shards 1")
    assert found.model_architectures == ("DeepseekV4ForCausalLM",)
    comm = Path(f"/proc/{pid}/comm").read_text().strip()  # 'python' or 'pytest', as this process was started
    assert [(x.pid, x.name, x.address) for x in found.listeners or ()] == [(pid, comm, "127.0.0.1")]
    assert (found.workdir_checked, found.workdir_writable) == (str(tmp_path), True)
    assert found.free_kib is not None and found.free_kib > 0
    assert found.sglang.editable and found.sglang.version == "0.5.23"
    assert found.interfaces is not None and "lo" in found.interfaces
    assert found.unanswered == ()


def test_the_probe_reads_a_host_without_model_or_sglang(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]  # bound, not listening: free for the probe
    found = run_probe(tmp_path / "gone", free_port, tmp_path, sys.executable, tmp_path / "sglang")
    assert found.model_dir is False and found.listeners == ()
    assert found.workdir_writable is True
    assert not found.sglang.editable  # this Python's sglang, if any, is not the checkout's


def listening_on(address: str, port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.bind((address, port))
    sock.listen()
    return sock


def probe_listeners(port: int) -> tuple[r.Listener, ...]:
    argv = r.listeners_argv(port)
    return r.parse_listeners(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)


def test_the_probe_reads_where_each_listener_listens() -> None:
    """An sshd on 127.157.142.2 once held a demo server's port number: serve refused a free port, and killed
    a healthy rollback server, as if the sshd held it."""
    with listening_on("127.157.142.2") as other:
        port = other.getsockname()[1]
        with listening_on("127.0.0.1", port):
            found = probe_listeners(port)
    assert sorted(x.address or "" for x in found) == ["127.0.0.1", "127.157.142.2"]
    assert [x.address for x in r.holding(found, "127.0.0.1")] == ["127.0.0.1"]
    assert len(r.holding(found, "0.0.0.0")) == 2


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_the_probe_reads_an_ipv6_listeners_address() -> None:
    try:
        sock = listening_on("::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    with sock:
        found = probe_listeners(sock.getsockname()[1])
    assert [x.address for x in found] == ["::1"]
    assert r.holding(found, "127.0.0.1") == [] and r.holding(found, "::") == list(found)
