"""Attaching to a plan that runs on a host: only when that plan tunes the shapes asked (pure).

``orch tune-fp8`` on a host whose tuning runs attaches to it (a re-run, a second orch at the same moment,
a plan another controller started there) rather than start jobs beside it. A plan tunes only its own
shapes: a command asking shapes it leaves out would exit 0 and install none of them. ``refuse_other_shapes``
refuses it instead, before anything changed, naming the running plan and what to do (wait for it, then run
the command again: it then tunes the rest). So are batch sizes the plan does not tune (``--batch-sizes``). A plan
whose jobs have all ended but that is not installed (another controller's, its install never run) is said so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from orchestrator.errors import RefusedError
from orchestrator.tuning_record import InstalledRecord, PlanRecord, Shape


def left_out(
    plan: PlanRecord, asked: Iterable[Shape], installed: Mapping[str, InstalledRecord], sizes: Sequence[int] = ()
) -> list[str]:
    """Keys of the ``asked`` shapes that the running ``plan`` does not tune at every batch size of ``sizes``
    (none: the plan's) and that are not ``installed`` (the host's configs) for the plan's GPU and SGLang commit
    at those sizes: what attaching to it would leave untuned."""
    wanted = set(sizes)
    planned = {s.key for s in plan.shapes} if wanted <= set(plan.batch_sizes) else set()
    done = {
        k
        for k, r in installed.items()
        if (r.device, r.commit) == (plan.device, plan.commit) and wanted <= set(r.batch_sizes)
    }
    return list(dict.fromkeys(s.key for s in asked if s.key not in planned | done))


def refuse_other_shapes(
    host: str,
    plan: PlanRecord,
    asked: Iterable[Shape],
    installed: Mapping[str, InstalledRecord],
    sizes: Sequence[int] = (),
    ended: Callable[[], bool] = lambda: False,
) -> None:
    """``RefusedError`` (exit 3) when attaching to ``plan`` would leave ``asked`` shapes (at batch sizes
    ``sizes``) untuned (``left_out``). ``ended``, asked only then: whether every job of the plan has ended (none
    runs, it is not installed: another controller's, or one whose install was cut off), said as such, with the
    ``orch wait`` that installs it (the watch installs a plan whose jobs all ended, or says why it failed)."""
    missing = left_out(plan, asked, installed, sizes)
    if not missing:
        return
    planned = "; ".join(s.key for s in plan.shapes)
    other = sorted(set(sizes) - set(plan.batch_sizes))
    at = f" at batch sizes {', '.join(map(str, other))}" if other else ""
    if ended():
        raise RefusedError(
            f"{host}: tuning plan {plan.id} ({planned}) ended and is not installed; it does not tune "
            f"{'; '.join(missing)}{at}",
            hint=f"`orch wait --host {host}` installs it (or says why it failed), then run this again",
        )
    raise RefusedError(
        f"{host}: a tuning of other shapes runs (plan {plan.id}: {planned}); it does not tune {'; '.join(missing)}{at}",
        hint=f"wait for it (`orch wait --host {host}`), then run this again",
    )
