"""SFTP's ``SSH_FX_FAILURE`` over real sshd (issue 27): a write the host refuses on a live connection fails
that host at once with one line, never "connection lost", and leaves no ``*.orch-tmp-*`` file behind.

OpenSSH's SFTP server answers a full disk (ENOSPC), a read-only file system (EROFS) and a rename onto a
directory (EISDIR) all with the same ``SSH_FX_FAILURE`` and no errno; the last needs no root to set up."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import HostError, UnreachableError
from orchestrator.fleet import Fleet
from orchestrator.inventory import load_inventory
from orchestrator.transport.ssh import ConnectOptions, SSHRunner
from tests.conftest import FleetEnv


def test_a_write_the_host_refuses_is_a_host_error_and_leaves_no_temporary_file(make_fleet) -> None:  # type: ignore[no-untyped-def]
    env: FleetEnv = make_fleet(1)
    host = next(iter(load_inventory(env.inventory).hosts.values()))
    config_dir = Path(host.workdir).parent / "configs"
    (config_dir / "E=1.json" / "in-the-way").mkdir(parents=True)  # the target is a non-empty directory
    with Fleet([host], ConnectOptions()) as fleet:
        runner = fleet.runner(host)
        assert isinstance(runner, SSHRunner)
        with pytest.raises(HostError) as raised:
            runner.write_bytes(str(config_dir / "E=1.json"), b"{}")
        assert not isinstance(raised.value, UnreachableError)
        assert "the host's SFTP server answered 'Failure': no space left on its disk, or a read-only file system" in (
            str(raised.value)
        )
        runner.write_bytes(str(config_dir / "other.json"), b"{}")  # the connection is fine
    assert sorted(p.name for p in config_dir.iterdir()) == ["E=1.json", "other.json"]
