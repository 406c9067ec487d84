"""One simulated GPU host: its disk, its sshd, its knobs and the GPU users on it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from orchestrator.sandbox import hostdisk, sshkeys
from orchestrator.sandbox.bastion import GatedSshDaemon, SimBastion
from orchestrator.sandbox.hostdisk import HostDisk
from orchestrator.sandbox.hosttools import nvidia_smi
from orchestrator.sandbox.loopback import wait_listening
from orchestrator.sandbox.processes import kill_host_processes
from orchestrator.sandbox.sshd import SshDaemon, sshd_config


class SimHost:
    """A simulated GPU box: a real sshd on ``address:ssh_port`` in front of a private disk at ``root``."""

    def __init__(
        self, name: str, address: str, ssh_port: int, server_port: int, root: Path, behind: SimBastion | None = None
    ) -> None:
        self.name = name
        self.address = address
        self.ssh_port = ssh_port
        self.server_port = server_port
        self.root = root
        self.disk = HostDisk(root)
        self.sglang_dir = self.disk.sglang_dir
        self.python = self.disk.python
        self.workdir = self.disk.workdir
        self.model_path = self.disk.model_path
        self.host_key = self.disk.etc / "ssh_host_ed25519_key"
        # ``behind``: the bastion through which alone the host is reachable
        self._sshd = (
            SshDaemon(root, address, ssh_port) if behind is None else GatedSshDaemon(root, address, ssh_port, behind)
        )
        self._holders: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"SimHost({self.name!r}, {self.address}:{self.ssh_port}, root={str(self.root)!r})"

    def configure_sshd(self, client_public_key: str, log_level: str = "VERBOSE") -> None:
        """Host key, authorized key and sshd_config (sshd is started separately)."""
        sshkeys.generate_key(self.host_key, f"{self.name}-host-key")
        authorized = self.disk.etc / "authorized_keys"
        authorized.write_text(client_public_key + "\n")
        config = sshd_config(
            address=self.address,
            port=self.ssh_port,
            host_key=self.host_key,
            authorized_keys=authorized,
            session_env=self.disk.session_env(),
            log_level=log_level,
        )
        self._sshd.config.write_text(config)

    def known_hosts_line(self) -> str:
        """``[addr]:port ssh-ed25519 AAAA...``: the line that makes orch trust this host."""
        return sshkeys.known_hosts_line(self.address, self.ssh_port, self.host_key)

    def start_sshd(self) -> None:
        self._sshd.start()

    def stop_sshd(self) -> None:
        """Stop the listener: new connections are refused; open sessions and their processes live on."""
        self._sshd.stop()

    def restart_sshd(self) -> None:
        self._sshd.stop()
        self._sshd.start()

    def drop_connections(self) -> int:
        """Cut every open SSH connection, as a network drop would: SIGKILL the listener's per-connection
        sshd processes (the listener stays up, so clients can reconnect). Returns how many were cut."""
        listener = self._sshd.pid
        cut = 0
        if isinstance(self._sshd, GatedSshDaemon):  # behind a bastion: one sshd -i per connection
            for pid in self._sshd.session_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    cut += 1
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the process ended meanwhile
            if listener is not None and int(fields[1]) == listener:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(stat.parent.name), signal.SIGKILL)
                    cut += 1
        return cut

    def sshd_running(self) -> bool:
        return self._sshd.running()

    @property
    def sshd_log(self) -> Path:
        """sshd's log file on this host (what a host's admin would read)."""
        return self._sshd.log

    def accepted_connections(self) -> int:
        """SSH connections this host accepted so far (restarts included)."""
        return self._sshd.accepted_connections()

    def env(self) -> dict[str, str]:
        """The environment of every command on this host (what the local transport must pass)."""
        return self.disk.session_env()

    @property
    def machine_id(self) -> str:
        """This host's machine-id (``etc/machine-id``: what ``systemd-id128 machine-id`` prints on it)."""
        return (self.disk.etc / "machine-id").read_text().strip()

    def machine_id_reads(self) -> int:
        """How many times orch read this host's machine-id so far (``systemd-id128 machine-id``)."""
        reads = self.disk.root / "log" / "machine-id.reads"
        return len(reads.read_text().splitlines()) if reads.exists() else 0

    def set_knobs(self, **knobs: object) -> None:
        """Merge knobs (listed in the simulated SGLang's ``_sim/host.py``); a None value restores the
        default. Tools read the knobs when they start."""
        hostdisk.merge_knobs(self.disk.knobs, knobs)

    def set_clock_offset(self, seconds: int) -> None:
        """Set this host's clock ``seconds`` off the controller's (negative: behind) for ``date +%s``, how
        orch's job scripts stamp start and end times: a ``date`` first on the host's PATH (installed on
        first use, so other tests run the real one directly)."""
        shim = self.disk.bin / "date"
        (self.disk.etc / "clock_offset").write_text(f"{int(seconds)}\n")
        if not shim.exists():
            shim.write_text(_DATE_SHIM)
            shim.chmod(0o755)

    def knobs(self) -> dict[str, object]:
        return hostdisk.read_knobs(self.disk.knobs)

    def hold_gpu(self, index: int, memory_mib: int = 20000) -> subprocess.Popen[bytes]:
        """Start a process orch did not start that holds GPU ``index`` (until killed or teardown)."""
        holder = subprocess.Popen(
            ["sleep", "infinity"],
            env=self.env(),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._holders.append(holder)
        entry = {
            "pid": holder.pid,
            "name": "sleep",
            "gpus": [index],
            "memory_mib": memory_mib,
            "start_time": nvidia_smi.process_start_time(holder.pid),
            "utilization": 0,
        }
        tmp = self.disk.gpus / f".{holder.pid}.tmp"
        tmp.write_text(json.dumps(entry))
        tmp.replace(self.disk.gpus / f"{holder.pid}.json")
        return holder

    def hold_port(self, port: int) -> subprocess.Popen[bytes]:
        """Start a process orch did not start that listens on ``port`` where the server binds by default
        (127.0.0.1) and answers ``GET /health`` with 200, until killed or teardown: a foreign listener."""
        www = self.root / "foreign-www"
        www.mkdir(exist_ok=True)
        (www / "health").write_text("ok\n")
        holder = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(www)],
            env=self.env(),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._holders.append(holder)
        wait_listening("127.0.0.1", port)
        return holder

    def drop_model(self) -> Path:
        """The model directory disappears (an NFS mount dropped); ``restore_model`` brings it back."""
        return self.model_path.rename(self.model_path.with_name(self.model_path.name + ".dropped"))

    def restore_model(self) -> None:
        self.model_path.with_name(self.model_path.name + ".dropped").rename(self.model_path)

    def import_sglang_from_copy(self) -> Path:
        """The host's python imports a copy of the checkout's sglang (as after a plain ``pip install``),
        not the checkout orch pulls; returns the copy's package directory. ``import_sglang_from_checkout``
        undoes it."""
        copy = self.root / "site-copy"
        if not copy.exists():
            shutil.copytree(self.sglang_dir / "python" / "sglang", copy / "sglang")
        hostdisk.point_editable(self.disk.venv, copy)
        return copy / "sglang"

    def import_sglang_from_checkout(self) -> None:
        hostdisk.point_editable(self.disk.venv, self.sglang_dir / "python")

    def gpu_processes(self) -> list[dict[str, object]]:
        """What ``nvidia-smi --query-compute-apps`` lists: one dict per (process, GPU) with
        ``pid, process_name, gpu_index, gpu_uuid, gpu_name, used_memory`` (MiB)."""
        return [{name: getattr(p, name) for name in p.__slots__} for p in nvidia_smi.gpu_processes(self.root)]

    def teardown(self) -> None:
        """Stop sshd and end every process of this host (sessions, jobs, servers, GPU holders)."""
        self._sshd.stop()
        kill_host_processes([self.root])
        self.reap_holders()

    def reap_holders(self) -> None:
        """Collect the GPU holders this host started (after they were killed)."""
        for holder in self._holders:
            holder.kill()
            holder.wait()
        self._holders.clear()


_DATE_SHIM = r"""#!/bin/sh
# The simulated host's clock: `date +%s` is off by etc/clock_offset seconds (SimHost.set_clock_offset).
off=$(cat "$ORCH_SIM_HOST/etc/clock_offset" 2>/dev/null || echo 0)
if [ "$#" = 1 ] && [ "$1" = "+%s" ]; then echo $(( $(/bin/date +%s) + off )); exit 0; fi
exec /bin/date "$@"
"""
