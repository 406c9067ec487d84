"""``orch doctor``'s output: one line per host (``ok``, ``warn`` or ``fail`` with the reasons), or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.facts.health import HostHealth
from orchestrator.fleet import FleetResult
from orchestrator.gateway import relaunch_drained
from orchestrator.inventory import Host
from orchestrator.ops.drain import Drained, Undrained


def doctor_line(h: HostHealth) -> str:
    """``<host>: <verdict>[: reason; reason][ (note; note)]``: the failures and warnings, then the notes
    (what doctor could not check)."""
    reasons = [f.text for f in h.findings if f.severity != "note"]
    notes = [f.text for f in h.findings if f.severity == "note"]
    line = f"{h.name}: {h.verdict}" + (": " + "; ".join(reasons) if reasons else "")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def refusal(h: HostHealth) -> str:
    """How ``run`` and ``serve --rolling`` say they leave a host out."""
    return f"{h.name}: skipped: doctor fails it: " + "; ".join(f.text for f in h.problems)


def doctor_lines(checked: Sequence[HostHealth]) -> None:
    from orchestrator.render import inert, out

    for h in checked:
        out.print(inert(doctor_line(h)), markup=False, highlight=False, soft_wrap=True)


def doctor_document(checked: Sequence[HostHealth]) -> dict[str, list[dict[str, Any]]]:
    """``doctor --json``: the shape of every ``--json`` of orch's over hosts, ``{"hosts": [{"name": ...}]}``."""
    hosts = [
        {
            "name": h.name,
            "verdict": h.verdict,
            "findings": [{"severity": f.severity, "text": f.text} for f in h.findings],
            **{k: None for k in ("driver", "cuda", "gpu")},  # null when not read (an unreachable host)
            **{k.lower(): v for k, v in h.versions.items()},
            "simulated": h.simulated,  # true: measured on orch's simulated torch; null: nothing measured
        }
        for h in checked
    ]
    return {"hosts": hosts}


def skipped_lines(sick: Sequence[HostHealth], drained: Sequence[Host] = ()) -> None:
    """``serve --rolling``'s line per host it leaves out (doctor fails it, or it is drained), on stderr,
    before the first wave."""
    from orchestrator.render import err, inert

    for line in map(refusal, sick):
        err.print(inert(line), markup=False, highlight=False, soft_wrap=True)
    drained_left_out([h.name for h in drained], "skipped: drained", plain=True)


def drained_left_out(names: Sequence[str], what: str, plain: bool = False) -> None:
    """The line on stderr per drained host a command leaves out (``gateway up``: ``drained: not registered``;
    ``serve --rolling``: ``skipped: drained``), saying how to put it back (``plain``: and how to relaunch it
    without the gateway, as a drained host is relaunched for inspection)."""
    from orchestrator.render import err, inert

    for name in names:
        err.print(
            inert(f"{name}: {what} (`orch undrain {name}` puts it back{_plain(name) if plain else ''})"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _plain(name: str) -> str:
    return f"; {relaunch_drained(name)}"


def drained_line(name: str, drained: Drained) -> str:
    """What ``orch drain`` did to one host; with no server of orch's there, that (undrain needs one serving)."""
    where = f"out of the gateway ({drained.url})" if drained.was_registered else "was not registered with the gateway"
    if not drained.server_runs:
        return (
            f"{name}: drained: {where}; no server orch launched runs here "
            f"(`orch serve --no-rolling --host {name}`, then `orch undrain {name}` puts it back: a rolling serve "
            "leaves a drained host out)"
        )
    return (
        f"{name}: drained: {where}, {drained.in_flight} requests were in flight; its server keeps running "
        f"(`orch undrain {name}` puts it back)"
    )


def drained_lines(results: FleetResult[Drained]) -> None:
    from orchestrator.render import inert, out

    for r in results:
        if r.value is not None:
            out.print(inert(drained_line(r.host.name, r.value)), markup=False, highlight=False, soft_wrap=True)


def undrained_lines(results: FleetResult[Undrained]) -> None:
    from orchestrator.render import inert, out

    for r in results:
        if r.value is not None:
            out.print(inert(undrained_line(r.host.name, r.value)), markup=False, highlight=False, soft_wrap=True)


def undrained_line(name: str, undrained: Undrained) -> str:
    """What ``orch undrain`` did to one host: put it back, or (never drained) found it in or registered it."""
    routed = f"{undrained.url} is healthy there and routed to"
    if undrained.was_drained:
        return f"{name}: back in the gateway: {routed}"
    if undrained.was_routed:
        return f"{name}: was not drained: already in the gateway, {routed}; nothing changed"
    return f"{name}: was not drained, but was not in the gateway either: now registered, {routed}"
