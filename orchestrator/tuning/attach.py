"""Attaching to a plan that runs on a host: only when that plan tunes the shapes asked (pure).

``orch tune-fp8`` on a host whose tuning runs attaches to it (a re-run, a second orch at the same moment,
a plan another controller started there) rather than start jobs beside it. A plan tunes only its own
shapes: a command asking shapes it leaves out would exit 0 and install none of them. ``refuse_other_shapes``
refuses it instead, before anything changed, naming the running plan and what to do (wait for it, then run
the command again: it then tunes the rest).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.errors import RefusedError
from orchestrator.tuning_record import InstalledRecord, PlanRecord, Shape


def left_out(plan: PlanRecord, asked: Iterable[Shape], installed: Mapping[str, InstalledRecord]) -> list[str]:
    """Keys of the ``asked`` shapes that the running ``plan`` does not tune and that are not ``installed`` (the
    host's record) for the plan's GPU and SGLang commit: what attaching to it would leave untuned."""
    planned = {s.key for s in plan.shapes}
    done = {k for k, r in installed.items() if (r.device, r.commit) == (plan.device, plan.commit)}
    return list(dict.fromkeys(s.key for s in asked if s.key not in planned | done))


def refuse_other_shapes(
    host: str, plan: PlanRecord, asked: Iterable[Shape], installed: Mapping[str, InstalledRecord]
) -> None:
    """``RefusedError`` (exit 3) when attaching to ``plan`` would leave ``asked`` shapes untuned (``left_out``)."""
    missing = left_out(plan, asked, installed)
    if not missing:
        return
    planned = "; ".join(s.key for s in plan.shapes)
    raise RefusedError(
        f"{host}: a tuning of other shapes runs (plan {plan.id}: {planned}); it does not tune {'; '.join(missing)}",
        hint=f"wait for it (`orch wait --host {host}`), then run this again",
    )
