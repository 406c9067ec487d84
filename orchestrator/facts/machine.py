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

This module is pure: the model (``Machine``, a field of ``state.HostState``), the command and its parser, the
decisions taken with it (``same_machine``, ``merged``, ``retired_name``) and the lines orch says;
``orchestrator.identity`` applies them to the state.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

_SCRIPT = "systemd-id128 machine-id 2>/dev/null || cat /etc/machine-id"
_ID = re.compile(r"^[0-9a-f]{32}$")


class Machine(BaseModel):
    """The machine a host's record was made on (issue 30 §1): ``address``
    (``host:port`` as the inventory reaches it, ``local`` for ``transport: local``) and its ``machine_id``
    (None: the host has none, or it could not be read)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    address: str
    machine_id: str | None = None

    def describe(self) -> str:
        """``machine 3f2a9c1e at 10.0.0.5:22`` (the id's first 8 characters: enough to tell two apart)."""
        which = f"machine {self.machine_id[:8]}" if self.machine_id else "the machine"
        return f"{which} at {self.address}"


def same_machine(recorded: Machine | None, now: Machine) -> bool:
    """Whether a record made on ``recorded`` applies to the machine seen ``now``. A record without one
    (an older orch wrote it) applies: its identity is filled in, never a false alarm. Two machine-ids
    decide alone (a box moved to a new address is the same box); without both, the address decides."""
    if recorded is None:
        return True
    if recorded.machine_id and now.machine_id:
        return recorded.machine_id == now.machine_id
    return recorded.address == now.address


def merged(recorded: Machine | None, now: Machine) -> Machine:
    """The identity to record after a contact that found the same machine: ``now``, keeping the recorded
    machine-id when this contact could not read one."""
    if recorded is not None and now.machine_id is None and recorded.machine_id:
        return now.model_copy(update={"machine_id": recorded.machine_id})
    return now


def retired_name(name: str, recorded: Machine, taken: Container[str]) -> str:
    """The name a record of another machine is kept under once ``name`` points elsewhere:
    ``gpu-1@3f2a9c1e`` (its machine-id's start, else its address), ``.2``... when taken."""
    base = f"{name}@{recorded.machine_id[:8] if recorded.machine_id else recorded.address}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}.{n}"
    return candidate


@dataclass
class Claim:
    """What tying a host's record to the machine seen now did (``identity.claim_machine``): the record
    of another machine (``recorded``) kept aside as ``kept_as``, or moved to ``moved_to``, the inventory name
    that machine is now (a swap); and the record that followed its machine from ``followed_from`` (a renamed
    host). None of them: the record was this machine's already."""

    recorded: Machine | None = None
    kept_as: str | None = None
    followed_from: str | None = None
    moved_to: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the claim put another record under the name (or none): one to read again."""
        return bool(self.kept_as or self.followed_from or self.moved_to)


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
    """What to say about tying ``name``'s record to ``now`` (``identity.claim_machine``): nothing when the
    record was this machine's."""
    said = []
    if claim.kept_as is not None and claim.recorded is not None:
        said.append(mismatch_line(name, claim.recorded, now, claim.kept_as))
    if claim.moved_to is not None and claim.recorded is not None:
        said.append(followed_line(claim.moved_to, name, claim.recorded))
        if claim.followed_from is None:
            said.append(f"{name}: now {now.describe()}: treated as a new host (nothing was stopped)")
    if claim.followed_from is not None:
        said.append(followed_line(name, claim.followed_from, now))
    return said
