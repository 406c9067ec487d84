"""``--shapes logged`` on a local runner: finding the host's last Triton server and reading its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import RefusedError
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from orchestrator.transport.local import LocalRunner
from orchestrator.tuning.logged import logged_shapes

DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TRITON = ["env", "python", "-m", "sglang.launch_server", "--tp-size", "8", "--fp8-gemm-backend", "triton"]
AUTO = ["env", "python", "-m", "sglang.launch_server", "--tp-size", "8"]


def missing(n: int, k: int, device: str = DEVICE) -> str:
    return (
        "[2026-12-01 10:00:00 TP0] Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
        f"Config file not found at /s/configs/{tf.config_file_name(n, k, device)}\n"
    )


def used(n: int, k: int) -> str:
    path = f"/s/configs/{tf.config_file_name(n, k, DEVICE)}"
    return f"[2026-12-01 10:00:00 TP0] Using configuration from {path} for W8A8 Block FP8 kernel.\n"


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host.model_validate({"name": "h1", "address": "127.0.0.1", "workdir": str(tmp_path / "work")})


def session(host: Host) -> HostSession:
    return HostSession(host, LocalRunner(host), StateStore(Path(host.workdir) / "state.json"))  # never read


def job(host: Host, job_id: str, started: int, argv: list[str], log: str | None, purpose: str = "server") -> None:
    """A finished job directory as orch's job wrapper leaves it."""
    d = Path(host.workdir) / "jobs" / job_id
    d.mkdir(parents=True)
    (d / "purpose").write_text(purpose + "\n")
    (d / "argv").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (d / "started_at").write_text(f"{started}\n")
    (d / "exit_code").write_text("0\n")
    if log is not None:
        (d / "log").write_text(log)


def test_the_last_triton_server_is_found_behind_a_later_auto_server(host: Host) -> None:
    job(host, "server-a", 100, TRITON, missing(1536, 4096))
    job(host, "server-b", 200, TRITON, missing(4096, 1024) + missing(8192, 1024) + missing(512, 4096, "NVIDIA H100"))
    job(host, "server-c", 300, AUTO, "")
    job(host, "tune.gpu0-x", 400, ["--fp8-gemm-backend", "triton"], "", purpose="tune.gpu0")
    logged = logged_shapes(session(host), DEVICE)
    assert [(s.key, s.source) for s in logged.shapes] == [
        ("N=4096,K=1024", "logged missing by server job server-b"),
        ("N=8192,K=1024", "logged missing by server job server-b"),
    ]
    assert logged.note is None


def test_no_triton_server_is_refused_saying_how_to_get_one(host: Host) -> None:
    job(host, "server-c", 300, AUTO, missing(1536, 4096))
    with pytest.raises(RefusedError) as caught:
        logged_shapes(session(host), DEVICE)
    assert str(caught.value) == (
        "h1: --shapes logged: no server launched with --fp8-gemm-backend triton has run on h1 "
        f"(in {host.workdir}/jobs)\n"
        "  hint: serve once with Triton (`orch serve --host h1 --fp8-gemm-backend triton`: untuned, serve would "
        "pick auto), or use --shapes default, auto or N=..,K=..;..."
    )


def test_a_server_that_found_every_config_leaves_nothing_to_tune(host: Host) -> None:
    job(host, "server-a", 100, TRITON, used(1536, 4096) + used(4096, 1024))
    logged = logged_shapes(session(host), DEVICE)
    assert logged.shapes == []
    assert logged.note == (
        "nothing to tune: server job server-a read a tuned config for every shape it looked up "
        "(N=1536,K=4096, N=4096,K=1024)"
    )


@pytest.mark.parametrize(
    ("log", "error"),
    [
        ("[2026-12-01 10:00:00 TP0] Load weight begin.\n", "shows no FP8 config lookup (did the server get as far"),
        (missing(1536, 4096, "NVIDIA H100"), "shows config lookups only for other GPUs or kernels, not NVIDIA RTX"),
        (None, "is gone"),
    ],
)
def test_a_log_that_names_no_shape_of_this_gpu_is_refused(host: Host, log: str | None, error: str) -> None:
    job(host, "server-a", 100, TRITON, log)
    with pytest.raises(RefusedError, match=r"^h1: --shapes logged: the log of server job server-a ") as caught:
        logged_shapes(session(host), DEVICE)
    assert error in str(caught.value)


RANK1 = [*TRITON, "--pp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.2:20000"]


def test_a_groups_host_tunes_what_its_own_rank_looked_up(host: Host) -> None:
    """On a host of a replica group the last Triton server is the host's own rank (its job, its log)."""
    job(host, "server-r1", 100, RANK1, missing(4096, 1024) + used(1536, 4096))
    logged = logged_shapes(session(host), DEVICE)
    assert [(s.key, s.source) for s in logged.shapes] == [
        ("N=4096,K=1024", "logged missing by rank 1's server job server-r1")
    ]


def test_a_rank_that_read_every_config_says_so_naming_its_rank(host: Host) -> None:
    job(host, "server-r1", 100, RANK1, used(1536, 4096))
    logged = logged_shapes(session(host), DEVICE)
    assert logged.note == (
        "nothing to tune: rank 1's server job server-r1 read a tuned config for every shape it looked up "
        "(N=1536,K=4096)"
    )
