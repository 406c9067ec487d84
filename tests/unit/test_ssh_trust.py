"""``orch trust --fingerprint`` (``transport.ssh.trust_host_key``): a value that is no fingerprint is refused before
any host is contacted; a key that does not match says how to read the host's own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import ExitCode, HostKeyError
from orchestrator.inventory import Host
from orchestrator.transport import ssh
from tests.conftest import OrchRun


@pytest.mark.parametrize("value", ["notafp", "SHA256:short", "MD5:16:27:ac:a5:76:28:2d:36:63:1b:56:4d:eb:df:a6:48"])
def test_a_fingerprint_that_is_not_one_is_exit_2_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun], value: str
) -> None:
    # `orch trust sim-1 --fingerprint notafp` connected, then said the offered key "does not match" (exit 3)
    inventory = tmp_path / "hosts.yaml"  # port 9: a connection would be refused, exit 3
    inventory.write_text("hosts:\n  sim-1: {address: 127.0.0.1, port: 9}\n")
    result = orch("-i", str(inventory), "--state", str(tmp_path / "s.db"), "trust", "sim-1", "--fingerprint", value)
    assert result.returncode == ExitCode.USAGE, result.output
    assert (
        f"Invalid value for '--fingerprint': {value!r} is not a host key fingerprint: write it as `ssh-keygen -lf` "
        "prints it on the host, SHA256: and 43 base64 characters (SHA256:Zk3...)"
    ) in " ".join(result.stderr.split())


def test_a_fingerprint_as_ssh_keygen_prints_it_is_one() -> None:
    key = paramiko.ECDSAKey.generate()
    assert ssh.fingerprint_problem(key.fingerprint) is None


def test_a_key_that_does_not_match_the_fingerprint_says_how_to_read_the_hosts_own() -> None:
    key = paramiko.ECDSAKey.generate()
    expected = "SHA256:" + "A" * 43
    with pytest.raises(HostKeyError) as refused:
        ssh._trust(Host(name="h1", address="127.0.0.1"), "127.0.0.1", key, expected)
    assert refused.value.exit_code == ExitCode.HOSTS_FAILED
    assert refused.value.message == (
        f"h1: offered key ecdsa-sha2-nistp256 {key.fingerprint} does not match the expected {expected}; nothing trusted"
    )
    assert refused.value.hint == (
        "read the host's own fingerprint out of band, on its console: "
        "`ssh-keygen -lf /etc/ssh/ssh_host_ecdsa_key.pub`; "
        "if it is not the one offered, something else answers at that address: do not trust it"
    )
