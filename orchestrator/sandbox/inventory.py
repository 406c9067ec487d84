"""The ``hosts.yaml`` that points orch at a simulated fleet (orch's inventory format)."""

from __future__ import annotations

import getpass
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.sandbox.host import SimHost


def host_entry(host: SimHost, transport: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"address": host.address}
    if transport == "ssh":
        entry["port"] = host.ssh_port
    entry.update(
        sglang_dir=str(host.sglang_dir),
        python=str(host.python),
        workdir=str(host.workdir),
        model_path=str(host.model_path),
        server_port=host.server_port,
    )
    if transport == "local":
        entry["env"] = host.env()
    return entry


def inventory_document(
    hosts: Sequence[SimHost],
    *,
    transport: str,
    gpus: int,
    client_key: Path,
    known_hosts: Path | None,
    defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """The inventory as data: ``defaults`` (user, key, known_hosts unless None, transport, gpus, extras)
    and one entry per host."""
    base: dict[str, Any] = {"user": getpass.getuser(), "identity_file": str(client_key)}
    if known_hosts is not None:
        base["known_hosts"] = str(known_hosts)
    base.update(transport=transport, gpus=gpus, **defaults)
    return {"defaults": base, "hosts": {h.name: host_entry(h, transport) for h in hosts}}


def write_inventory(path: Path, document: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(document), sort_keys=False, default_flow_style=False))
    return path
