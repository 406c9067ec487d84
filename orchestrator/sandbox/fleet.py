"""A simulated GPU fleet: N hosts on loopback, one upstream SGLang, one client key.

::

    with SimFleet(tmp / "fleet", n_hosts=2) as fleet:
        inventory = fleet.write_inventory(tmp / "hosts.yaml")
        sha = fleet.add_upstream_commit("Faster FP8 GEMM")
        ...                                   # run orch -i inventory ...
    # every sshd, every process started on the hosts and the temp dir (if the fleet made it) are gone

Files under ``root``: ``upstream.git`` (bare) and ``upstream-work`` (the clone commits are made in),
``client/id_ed25519`` (orch's key), ``known_hosts`` (every host's key), ``hosts/<name>/`` (each host's
disk, see ``hostdisk``). With ``transport="local"`` no sshd runs: orch runs the host's commands on
this machine with the host's environment (``env`` in the inventory). With ``bastion=True`` the hosts
are reachable only through ``fleet.bastion``, a real sshd jump host (``bastion``; its key is in
``known_hosts`` too): the inventory needs ``proxy_jump`` (or an ssh config ProxyJump) to reach them.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator.sandbox import gitrepo, hostdisk, inventory, loopback, sshkeys
from orchestrator.sandbox.bastion import SimBastion
from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.host import SimHost
from orchestrator.sandbox.processes import kill_host_processes
from orchestrator.sandbox.sshd import sshd_installed

DEFAULT_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TRANSPORTS = ("ssh", "local")
DEMO_DATASET = Path(__file__).resolve().parent / "datasets" / "sharegpt-demo.json"
"""A small ShareGPT-format dataset of generated conversations (``demo_dataset`` writes it): the simulated hosts
have no internet, and the benchmark's ``random`` dataset samples its text from a local file (reference §3).
1,024 conversations: the benchmark sends at most one request per conversation, and a sweep at concurrency
128 asks for 256."""


def stage_demo_dataset(workdir: Path) -> Path:
    """``DEMO_DATASET`` at the playbooks' default ``bench.dataset_path`` under a host's orch ``workdir``
    (private, as orch makes its directories)."""
    from orchestrator.recipe import BenchSpec

    target = workdir / BenchSpec().dataset_path
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    workdir.chmod(0o700)
    shutil.copyfile(DEMO_DATASET, target)
    return target


class SimFleet:
    """Simulated hosts that orch drives like real ones. A context manager: enter starts, exit tears down."""

    def __init__(
        self,
        root: Path | None = None,
        n_hosts: int = 2,
        *,
        transport: str = "ssh",
        gpu_name: str = DEFAULT_GPU_NAME,
        gpus: int = 8,
        name_prefix: str = "sim",
        sshd_log_level: str = "VERBOSE",
        bastion: bool = False,
        dataset: bool = True,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self._made_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="orch-fleet-")) if root is None else Path(root).resolve()
        self.transport = transport
        self.gpu_name = gpu_name
        self.gpus = gpus
        self.sshd_log_level = sshd_log_level
        self.dataset = dataset  # each host has DEMO_DATASET at the playbooks' default bench.dataset_path
        self.upstream = self.root / "upstream.git"
        self.client_key = self.root / "client" / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.bastion: SimBastion | None = None  # with bastion=True: the hosts are reachable only through it
        self._subnet = loopback.fleet_subnet()
        if bastion:
            if n_hosts >= loopback.MAX_HOSTS:
                raise ValueError(f"a fleet behind a bastion has fewer than {loopback.MAX_HOSTS} hosts")
            address = loopback.host_address(self._subnet, loopback.MAX_HOSTS - 1)
            self.bastion = SimBastion(self.root / "bastion", address, loopback.free_port(address))
        self.hosts = self._plan_hosts(n_hosts, name_prefix)
        self._started = self._detached = False

    def _plan_hosts(self, n_hosts: int, prefix: str) -> list[SimHost]:
        subnet = self._subnet
        behind = self.bastion
        hosts = []
        for i in range(n_hosts):
            address = loopback.host_address(subnet, i)
            ssh_port, server_port = loopback.free_port(address), loopback.free_port(address, "127.0.0.1")
            root = self.root / "hosts" / f"{prefix}-{i + 1}"
            hosts.append(SimHost(f"{prefix}-{i + 1}", address, ssh_port, server_port, root, behind))
        return hosts

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> SimFleet:
        """Create upstream, keys and every host's disk, then start every sshd (ssh transport)."""
        if self._started:
            return self
        if self.transport == "ssh" and not sshd_installed():
            raise SandboxError(
                "OpenSSH server is not installed (/usr/sbin/sshd)",
                hint="apt-get install openssh-server, or use the local transport",
            )
        if self.upstream.exists():
            raise SandboxError(f"{self.root} already holds a simulated fleet", hint="give each fleet a new root")
        self._started = True
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        return self

    def _build(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        gitrepo.create_upstream(self.upstream, self.root / "upstream-work")
        sshkeys.generate_key(self.client_key, "orch-sandbox-client")
        template = hostdisk.make_venv_template(self.root / "venv-template")
        knobs = {"gpus": self.gpus, "gpu_name": self.gpu_name}
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda host: self._prepare_host(host, template, knobs), self.hosts))
        lines = [h.known_hosts_line() for h in self.hosts]
        if self.bastion is not None:
            targets = [(h.address, h.ssh_port) for h in self.hosts]
            self.bastion.configure(sshkeys.public_key(self.client_key), targets, self.sshd_log_level)
            if self.transport == "ssh":
                self.bastion.start()
            lines.append(self.bastion.known_hosts_line())
        self.known_hosts.write_text("".join(line + "\n" for line in lines))

    def _prepare_host(self, host: SimHost, template: Path, knobs: dict[str, object]) -> None:
        hostdisk.prepare(host.disk, self.upstream, template, knobs)
        if self.dataset:
            stage_demo_dataset(host.workdir)
        host.configure_sshd(sshkeys.public_key(self.client_key), self.sshd_log_level)
        if self.transport == "ssh":
            host.start_sshd()

    def host(self, name: str) -> SimHost:
        return next(h for h in self.hosts if h.name == name)

    def write_inventory(self, path: Path, *, trust: bool = True, **defaults: Any) -> Path:
        """Write orch's ``hosts.yaml`` for this fleet; ``trust=False`` leaves the host keys unknown."""
        document = inventory.inventory_document(
            self.hosts,
            transport=self.transport,
            gpus=self.gpus,
            client_key=self.client_key,
            known_hosts=self.known_hosts if trust else None,
            defaults=defaults,
        )
        return inventory.write_inventory(path, document)

    def add_upstream_commit(self, message: str, files: dict[str, str] | None = None) -> str:
        """Commit ``files`` (relative path → text; default: a change-log line) to upstream; the new sha."""
        return gitrepo.commit_and_push(self.root / "upstream-work", message, files)

    def detach(self) -> None:
        """Leave everything running and in place: stop() and exit no longer tear anything down."""
        self._detached = True

    def stop(self) -> None:
        """Stop every sshd, end every process of every host, remove the root if the fleet made it."""
        if self._detached or not self._started:
            return
        for host in self.hosts:
            host.stop_sshd()
        if self.bastion is not None:
            self.bastion.stop()
        kill_host_processes([*(h.root for h in self.hosts), *([self.bastion.root] if self.bastion else [])])
        for host in self.hosts:
            host.reap_holders()
        if self._made_root:
            shutil.rmtree(self.root, ignore_errors=True)
        self._started = False
