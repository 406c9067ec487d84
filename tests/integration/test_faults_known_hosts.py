"""known_hosts as organisations write them (issue 13): @cert-authority, @revoked and hashed entries.

An ``@cert-authority`` line in ~/.ssh/known_hosts used to make every host unreachable with a
traceback (paramiko's parser raises on marker lines). A CA line cannot vouch for a plain host key, so
orch skips it; hosts whose own key is listed (plainly or hashed) still connect; a key marked
``@revoked`` is refused even where another line lists it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.conftest import FleetEnv


def hashed(tmp: Path, line: str) -> str:
    """``line`` with its host name hashed, as ``ssh-keygen -H`` writes it (``|1|salt|hash keytype key``)."""
    tmp.write_text(line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(tmp)], check=True, capture_output=True)
    (out,) = [x for x in tmp.read_text().splitlines() if x and not x.startswith("#")]
    assert out.startswith("|1|"), out
    return out


def ca_key(tmp: Path) -> str:
    """The public half of a fresh ed25519 key, as a CA's line carries it."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp)], check=True)
    return " ".join(Path(f"{tmp}.pub").read_text().split()[:2])


def organisation_known_hosts(env: FleetEnv, tmp_path: Path, home: Path, revoke: int | None = None) -> None:
    """~/.ssh/known_hosts: a CA line, then host 0's key hashed; the inventory's file keeps host 1's plain."""
    lines = env.fleet.known_hosts.read_text().splitlines()  # type: ignore[attr-defined]
    user = [
        "# organisation-wide",
        f"@cert-authority *.corp.example,10.* {ca_key(tmp_path / 'ca')}",
        hashed(tmp_path / "one", lines[0]),
    ]
    if revoke is not None:
        user.append("@revoked * " + " ".join(lines[revoke].split()[1:]))
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "known_hosts").write_text("\n".join(user) + "\n")
    env.fleet.known_hosts.write_text("\n".join(lines[1:]) + "\n")  # type: ignore[attr-defined]


def test_cert_authority_and_hashed_lines_leave_every_host_reachable(
    make_fleet: Callable[..., FleetEnv], tmp_path: Path, isolated_env: Path
) -> None:
    env = make_fleet(2)
    organisation_known_hosts(env, tmp_path, isolated_env)
    run = env.orch("status", "--json")
    assert run.returncode == 0, run.output
    assert "Traceback" not in run.output
    hosts = json.loads(run.stdout)["hosts"]
    assert [h["name"] for h in hosts] == [h.name for h in env.fleet.hosts]  # type: ignore[attr-defined]
    assert all(h.get("error") is None for h in hosts), hosts


def test_a_revoked_key_is_refused_even_where_another_line_lists_it(
    make_fleet: Callable[..., FleetEnv], tmp_path: Path, isolated_env: Path
) -> None:
    env = make_fleet(2)
    organisation_known_hosts(env, tmp_path, isolated_env, revoke=1)
    revoked = env.fleet.hosts[1]  # type: ignore[attr-defined]
    run = env.orch("status", "--json")
    assert run.returncode == 3, run.output
    assert "Traceback" not in run.output
    hosts = {h["name"]: h for h in json.loads(run.stdout)["hosts"]}
    assert hosts[env.fleet.hosts[0].name].get("error") is None  # type: ignore[attr-defined]
    error = hosts[revoked.name]["error"]
    assert f"{revoked.name}: host key ssh-" in error and "is marked @revoked in " in error, error
    trust = env.orch("trust", revoked.name)
    assert trust.returncode != 0 and "@revoked" in trust.stderr, trust.output
    assert "Traceback" not in trust.output
