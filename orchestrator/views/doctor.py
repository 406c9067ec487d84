"""``orch doctor``'s output: one line per host (``ok``, ``warn`` or ``fail`` with the reasons), or JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.facts.health import HostHealth


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


def doctor_document(checked: Sequence[HostHealth]) -> list[dict[str, Any]]:
    return [
        {
            "host": h.name,
            "verdict": h.verdict,
            "findings": [{"severity": f.severity, "text": f.text} for f in h.findings],
            **{k.lower(): v for k, v in h.versions.items()},
        }
        for h in checked
    ]
