"""Which machine a host's record describes (issue 30 §1: "a record belongs to a machine").

orch keys its state by inventory name, but a name can be pointed at another box (a replacement at a
new address, two inventories sharing one state directory, each with its own ``gpu-1``). So each record
carries the ``Machine`` it was made on: the ``address:port`` orch reached it at, and the machine's own
``/etc/machine-id`` (what the machine proves). The machine-id, not the SSH host key: the transport already
refuses a host key it does not know (known_hosts), a key is often carried over to a replacement with the
image or the address, and ``transport: local`` has none; the machine-id is the OS install's own and is
read with the probe orch runs anyway (``status``) or one ``cat`` otherwise. ``systemd-id128 machine-id``
first: the same file on a systemd host, and a tool the simulated fleet can stand in for per host (as it
does for ``nvidia-smi`` and ``df``).

This module is pure: the command, its parser, and the lines orch says; the model (``state.Machine``) and the
decisions the store takes with it (``state.same_machine``, ``merged``, ``retired_name``) are the state's.
"""

from __future__ import annotations

import re

from orchestrator.state import Claim, Machine

_SCRIPT = "systemd-id128 machine-id 2>/dev/null || cat /etc/machine-id"
_ID = re.compile(r"^[0-9a-f]{32}$")


def machine_argv() -> list[str]:
    """Print the host's machine-id (read-only; its own probe section in ``orch status``)."""
    return ["sh", "-c", _SCRIPT, "orch-machine-id"]


def parse_machine_id(output: str) -> str | None:
    """The machine-id in ``output`` (32 lowercase hex digits on the first line), else None: an empty
    ``/etc/machine-id`` (a container, an image not booted yet) proves nothing."""
    first = output.strip().splitlines()[:1]
    value = first[0].strip().lower() if first else ""
    return value if _ID.match(value) else None


def address_of(address: str, port: int, transport: str) -> str:
    """``host:port`` the inventory reaches the host at (``local``: the controller itself)."""
    return "local" if transport == "local" else f"{address}:{port}"


def mismatch_line(name: str, recorded: Machine, now: Machine, kept_as: str) -> str:
    """The one line said when ``name``'s record is of another machine than the one it reaches now."""
    return (
        f"{name}: the state's record is of {recorded.describe()}, but {name} is now {now.describe()}: "
        f"its record is not applied here ({name} is treated as a new host; nothing was stopped) and is kept "
        f"as {kept_as!r} (`orch state show {kept_as}`; `orch state forget {kept_as}` drops it); if the inventory "
        f"points {name} at the wrong machine, fix it and the record follows its machine back; two inventories "
        "sharing one state need a --state each"
    )


def followed_line(name: str, old_name: str, now: Machine) -> str:
    """The line said when a record follows its machine to a new name (a renamed inventory host)."""
    return f"{name}: the state's record of {old_name!r} follows its machine ({now.describe()}) to this name"


def claim_lines(claim: Claim, name: str, now: Machine) -> list[str]:
    """What to say about tying ``name``'s record to ``now`` (``StateStore.claim_machine``): nothing when the
    record was this machine's."""
    said = []
    if claim.kept_as is not None and claim.recorded is not None:
        said.append(mismatch_line(name, claim.recorded, now, claim.kept_as))
    if claim.followed_from is not None:
        said.append(followed_line(name, claim.followed_from, now))
    return said
