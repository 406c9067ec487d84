"""Throwaway SSH keys (``ssh-keygen``) and the ``known_hosts`` line of a simulated host."""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.sandbox.errors import SandboxError


def generate_key(path: Path, comment: str) -> Path:
    """A new ed25519 key pair without passphrase at ``path`` (private) and ``path.pub``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
    try:
        subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError as error:
        raise SandboxError("ssh-keygen is not installed", hint="apt-get install openssh-client") from error
    path.chmod(0o600)
    return path


def public_key(private_key: Path) -> str:
    """``"ssh-ed25519 AAAA..."`` (type and key, without the comment)."""
    key_type, blob, *_ = Path(f"{private_key}.pub").read_text().split()
    return f"{key_type} {blob}"


def known_hosts_line(address: str, port: int, host_key: Path) -> str:
    """The line OpenSSH records for ``address:port`` (brackets unless the port is 22)."""
    where = address if port == 22 else f"[{address}]:{port}"
    return f"{where} {public_key(host_key)}"
