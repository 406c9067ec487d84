"""The simulated fleet itself: real sshd on loopback, nvidia-smi, host keys, upstream commits, teardown."""

from __future__ import annotations

import itertools
import subprocess

import yaml

from orchestrator.sandbox import SimFleet
from tests.sandbox.conftest import GPU_NAME, pid_alive, ssh, wait_until

QUERY_GPU = (
    "nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,utilization.gpu,compute_cap "
    "--format=csv,noheader,nounits"
)
QUERY_APPS = "nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv,noheader,nounits"


def test_hosts_have_distinct_loopback_addresses_and_ports(fleet: SimFleet) -> None:
    addresses = [h.address for h in fleet.hosts]
    assert all(a.startswith("127.") for a in addresses) and len(set(addresses)) == 2
    ports = [p for h in fleet.hosts for p in (h.ssh_port, h.server_port)]
    assert len(set(ports)) == 4
    assert all(h.sshd_running() for h in fleet.hosts)


def test_nvidia_smi_over_ssh_lists_eight_blackwell_gpus(fleet: SimFleet) -> None:
    for host in fleet.hosts:
        run = ssh(fleet, host, QUERY_GPU)
        assert run.returncode == 0, run.stderr
        rows = [line.split(", ") for line in run.stdout.splitlines()]
        assert [r[0] for r in rows] == [str(i) for i in range(8)]
        assert {r[1] for r in rows} == {GPU_NAME}
        assert all(r[2].startswith("GPU-") for r in rows) and len({r[2] for r in rows}) == 8
        assert {(r[3], r[4], r[5], r[6]) for r in rows} == {("97887", "0", "0", "12.0")}


def test_nvidia_smi_csv_with_header_and_units(fleet: SimFleet) -> None:
    run = ssh(fleet, fleet.hosts[0], "nvidia-smi --query-gpu=memory.used,index -i 2 --format=csv")
    assert run.stdout == "memory.used [MiB], index\n0 MiB, 2\n"
    bad = ssh(fleet, fleet.hosts[0], "nvidia-smi --query-gpu=index,bogus --format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout
    listing = ssh(fleet, fleet.hosts[0], "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == 8 and listing[0].startswith(f"GPU 0: {GPU_NAME} (UUID: GPU-")


def test_held_gpu_shows_in_compute_apps_until_its_process_ends(fleet: SimFleet) -> None:
    host = fleet.hosts[1]
    holder = host.hold_gpu(3, memory_mib=20000)
    uuid = ssh(fleet, host, "nvidia-smi --query-gpu=uuid --format=csv,noheader -i 3").stdout.strip()
    apps = ssh(fleet, host, QUERY_APPS).stdout
    assert apps == f"{holder.pid}, sleep, {uuid}, 20000\n"
    used = ssh(fleet, host, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits").stdout
    assert "3, 20000" in used.splitlines() and "2, 0" in used.splitlines()
    assert [p["pid"] for p in host.gpu_processes()] == [holder.pid]
    holder.kill()
    holder.wait()
    assert ssh(fleet, host, QUERY_APPS).stdout == "" and host.gpu_processes() == []


def test_nvidia_smi_driver_failure_knob(fleet: SimFleet) -> None:
    host = fleet.hosts[0]
    host.set_knobs(nvidia_smi_fail=True)
    try:
        run = ssh(fleet, host, QUERY_GPU)
    finally:
        host.set_knobs(nvidia_smi_fail=None)
    assert run.returncode == 9
    assert run.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_stopped_sshd_refuses_connections_but_a_started_process_survives(fleet: SimFleet) -> None:
    host = fleet.hosts[0]
    started = ssh(fleet, host, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    pid = int(started.stdout)
    before = host.accepted_connections()
    host.stop_sshd()
    try:
        refused = ssh(fleet, host, "true")
        assert refused.returncode == 255 and "Connection refused" in refused.stderr
        assert not host.sshd_running() and pid_alive(pid)
    finally:
        host.start_sshd()
    assert ssh(fleet, host, f"kill {pid}").returncode == 0
    wait_until(lambda: not pid_alive(pid), what="the process to end")
    assert host.accepted_connections() == before + 1


def test_restart_keeps_an_open_session(fleet: SimFleet) -> None:
    host = fleet.hosts[1]
    argv = [
        "ssh",
        "-i",
        str(fleet.client_key),
        "-o",
        f"UserKnownHostsFile={fleet.known_hosts}",
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-p",
        str(host.ssh_port),
        f"root@{host.address}",
        "sleep 1; echo still-here",
    ]
    log = host.root / "log" / "sshd.log"
    sessions = log.read_text().count("Starting session")
    session = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: log.read_text().count("Starting session") > sessions, what="the session to start")
    host.restart_sshd()
    out, _ = session.communicate(timeout=15)
    assert out == "still-here\n" and session.returncode == 0
    assert ssh(fleet, host, "echo again").stdout == "again\n"


def test_sessions_get_the_host_environment(fleet: SimFleet) -> None:
    host = fleet.hosts[0]
    run = ssh(fleet, host, 'echo "$ORCH_SIM_HOST|$HOME|$(command -v nvidia-smi)"')
    assert run.stdout.strip() == f"{host.root}|{host.root / 'home'}|{host.root / 'bin' / 'nvidia-smi'}"
    probe = "import sglang, sglang.kernels.ops.gemm.fp8_kernel as k; print(sglang.__version__, k.CONFIG_DIR)"
    run = ssh(fleet, host, f"{host.python} -c '{probe}'")
    assert run.stdout.split() == ["0.5.23", str(host.sglang_dir / "python/sglang/kernels/ops/gemm/configs")]
    assert host.model_path.joinpath("config.json").exists()
    assert sorted(p.name for p in host.workdir.rglob("*")) in ([], ["datasets", "sharegpt.json"])  # staged only


def test_upstream_commit_is_one_new_commit_after_fetch(fleet: SimFleet) -> None:
    host = fleet.hosts[1]
    git = f"git -C {host.sglang_dir}"
    assert ssh(fleet, host, f"{git} rev-parse --abbrev-ref HEAD").stdout.strip() == "main"
    sha = fleet.add_upstream_commit("Faster FP8 GEMM", {"python/sglang/NOTES.md": "fast\n"})
    run = ssh(
        fleet,
        host,
        f"{git} fetch --quiet origin && {git} rev-list --count HEAD..origin/main "
        f"&& {git} rev-parse origin/main && {git} log -1 --format=%s origin/main",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["1", sha, "Faster FP8 GEMM"]


def test_inventory_schema_and_untrusted_keys(fleet: SimFleet) -> None:
    path = fleet.write_inventory(fleet.root / "untrusted.yaml", trust=False, upstream="origin/main")
    doc = yaml.safe_load(path.read_text())
    assert doc["defaults"] == {
        "user": "root",
        "identity_file": str(fleet.client_key),
        "transport": "ssh",
        "gpus": 8,
        "upstream": "origin/main",
    }
    host = fleet.hosts[0]
    assert doc["hosts"][host.name] == {
        "address": host.address,
        "port": host.ssh_port,
        "sglang_dir": str(host.sglang_dir),
        "python": str(host.python),
        "workdir": str(host.workdir),
        "model_path": str(host.model_path),
        "server_port": host.server_port,
    }
    trusted = yaml.safe_load(fleet.write_inventory(fleet.root / "hosts.yaml").read_text())
    assert trusted["defaults"]["known_hosts"] == str(fleet.known_hosts)
    assert fleet.known_hosts.read_text().splitlines()[0] == host.known_hosts_line()
    assert host.known_hosts_line().startswith(f"[{host.address}]:{host.ssh_port} ssh-ed25519 AAAA")


def test_teardown_ends_host_processes_and_removes_its_temp_dir() -> None:
    fleet = SimFleet(n_hosts=1)
    with fleet:
        host = fleet.hosts[0]
        pid = int(ssh(fleet, host, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!").stdout)
        holder = host.hold_gpu(0)
        assert pid_alive(pid)
    assert not pid_alive(pid) and holder.returncode is not None
    assert not host.sshd_running() and not fleet.root.exists()


def test_local_transport_starts_no_sshd_and_passes_the_host_env(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with SimFleet(tmp_path / "fleet", n_hosts=1, transport="local") as fleet:
        host = fleet.hosts[0]
        assert not host.sshd_running()
        doc = yaml.safe_load(fleet.write_inventory(tmp_path / "hosts.yaml").read_text())
        entry = doc["hosts"][host.name]
        assert doc["defaults"]["transport"] == "local" and "port" not in entry
        assert entry["env"]["ORCH_SIM_HOST"] == str(host.root)
        run = subprocess.run(["nvidia-smi", "-L"], env=entry["env"], capture_output=True, text=True)
        assert len(run.stdout.splitlines()) == 8


def test_parallel_test_workers_hand_out_ports_from_their_own_slices() -> None:
    from orchestrator.sandbox.loopback import PORTS, port_range

    slices = [port_range({"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "3"}) for i in range(3)]
    assert slices[0][0] == PORTS[0] and all(a[1] < b[0] for a, b in itertools.pairwise(slices))
    assert slices[-1][1] <= PORTS[1]
    assert port_range({}) == port_range({"PYTEST_XDIST_WORKER": "gw5", "PYTEST_XDIST_WORKER_COUNT": "2"}) == PORTS
