"""Reading known_hosts (issue 13): marker lines, hashed names and junk never raise; @revoked wins."""

from __future__ import annotations

import logging
from pathlib import Path

import paramiko
import pytest

from orchestrator.inventory import Host
from orchestrator.transport.ssh import HostKeyTable, KnownHosts


def line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}"


@pytest.fixture
def keys() -> list[paramiko.PKey]:
    return [paramiko.ECDSAKey.generate() for _ in range(3)]


def found(known: HostKeyTable, name: str) -> dict[str, paramiko.PKey]:
    return known.lookup(name)


def load(tmp_path: Path, text: str) -> tuple[HostKeyTable, dict[bytes, Path]]:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    known = KnownHosts().table(Host(name="h", address="a", known_hosts=str(path)))
    return known, known.revoked


def test_marker_hashed_and_junk_lines_are_handled(
    tmp_path: Path, keys: list[paramiko.PKey], caplog: pytest.LogCaptureFixture
) -> None:
    ca, one, two = keys
    hashed = paramiko.HostKeys.hash_host("[10.0.0.2]:2222")
    text = "\n".join(
        [
            f"@cert-authority *.corp.example {ca.get_name()} {ca.get_base64()}",
            f"@cert-authority\t10.*\t{ca.get_name()}\t{ca.get_base64()}",
            f"@unknown-marker x {ca.get_name()} {ca.get_base64()}",
            "not a host key line at all",
            "short line",
            line("10.0.0.1", one),
            line(hashed, two),
        ]
    )
    with caplog.at_level(logging.DEBUG, logger="orchestrator.transport.ssh"):
        known, revoked = load(tmp_path, text + "\n")
    assert revoked == {}
    assert found(known, "10.0.0.1") == {one.get_name(): one}
    assert found(known, "[10.0.0.2]:2222") == {two.get_name(): two}
    assert found(known, "x.corp.example") == {}  # a CA line vouches for no plain key
    assert "skipping a @cert-authority line" in caplog.text


def test_revoked_key_is_dropped_everywhere_and_reported(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    one, two, _ = keys
    known, revoked = load(tmp_path, "\n".join([line("a", one), line("b,c", two), "@revoked * " + line("", two)[1:]]))
    assert revoked == {two.asbytes(): tmp_path / "known_hosts"}
    assert found(known, "a") == {one.get_name(): one}
    assert found(known, "b") == found(known, "c") == {}


def test_first_line_for_a_name_wins(tmp_path: Path, keys: list[paramiko.PKey]) -> None:
    one, two, _ = keys
    known, _ = load(tmp_path, line("a", one) + "\n" + line("a", two) + "\n")
    assert found(known, "a") == {one.get_name(): one}
