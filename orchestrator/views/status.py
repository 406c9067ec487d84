"""What `orch status` shows: the table, the notes below it, the details and the JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from orchestrator.facts.git import describe_lag
from orchestrator.facts.group import GroupStatus
from orchestrator.ops.status import HostStatus
from orchestrator.render import fmt_mib, inert, table, to_jsonable
from orchestrator.text import fmt_ranges
from orchestrator.views.gateway import out_for_rollout

if TYPE_CHECKING:  # rich is imported by what prints a table: `orch status --json` needs none of it
    from rich.table import Table


def status_document(
    views: list[HostStatus], gateway: dict[str, Any] | None = None, groups: Sequence[GroupStatus] = ()
) -> dict[str, Any]:
    """The ``--json`` document: ``hosts`` (each with its ``gateway`` entry when the inventory has one),
    ``groups`` (each replica group shown: name, hosts in rank order, rank0, serving, down: host → why) and,
    with a gateway, ``gateway`` (url, reachable, error, not_in_inventory)."""
    hosts = []
    for v in views:
        doc = to_jsonable(v)
        sg = v.sglang or {}
        doc["sglang"] = (
            {
                "commit": sg.get("commit"),
                "branch": sg.get("branch"),
                "behind": sg.get("behind"),
                "ahead": sg.get("ahead"),
                "in_progress": sg.get("in_progress"),
                "subject": sg.get("subject"),
                "upstream": sg.get("upstream"),
                "fetched_at": sg.get("fetched_at"),
            }
            if v.sglang
            else None
        )
        doc.update(doc.pop("extra"))
        hosts.append(doc)
    found = {"hosts": hosts, "groups": [g.document() for g in groups]}
    return {**found, **({"gateway": gateway} if gateway is not None else {})}


# -- small formats ---------------------------------------------------------------------------------------


def _when(iso: str | None) -> datetime | None:
    """A timestamp as the state and ``status --json`` write it (``...Z`` or ``+00:00``)."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")) if iso else None


def fmt_age(seconds: float) -> str:
    """``just now``, ``5 min``, ``2 h``, ``3 d``: how long ago, as precisely as an operator needs."""
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h"
    return f"{seconds // 86400:.0f} d"


def _ago(iso: str | None, now: datetime, short: bool = False) -> str | None:
    """``2 h ago`` (``short``: ``2h ago``), ``just now``; None without a time."""
    when = _when(iso)
    if when is None:
        return None
    age = fmt_age((now - when).total_seconds())
    if age == "just now":
        return age
    return f"{age.replace(' min', 'm').replace(' ', '') if short else age} ago"


def _uptime(seconds: int) -> str:
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


# -- cells of the wide table and of `orch status HOST` ------------------------------------------------------


def _fetched(v: HostStatus, now: datetime) -> str:
    ago = _ago((v.sglang or {}).get("fetched_at"), now)
    return f"fetched {ago}" if ago else "never fetched"


def _sglang_cell(v: HostStatus, now: datetime | None = None) -> str:
    if not v.sglang:
        return "-"
    sg = v.sglang
    behind = sg.get("behind")
    lag = "" if behind is None and not sg.get("in_progress") else f" ({_lag(sg)}"
    fetched = f", {_fetched(v, now)})" if now is not None and lag else ")" if lag else ""
    line = f"{sg.get('branch')} {sg.get('short') or str(sg.get('commit'))[:10]} {sg.get('subject', '')}{lag}{fetched}"
    imported = _import_cell(v.extra.get("sglang_import"))
    return f"{line}; {imported}" if imported else line


def _import_cell(found: dict[str, Any] | None) -> str | None:
    """Where the host's python imports sglang from: ``python imports sglang 0.5.23 from the checkout``, or
    what is wrong."""
    if not found:
        return None
    if found.get("error"):
        return f"python cannot import sglang: {found['error']} (`orch pull --install`)"
    version = found.get("version") or "unknown version"
    if found.get("editable"):
        return f"python imports sglang {version} from the checkout"
    return f"python imports sglang {version} from {found.get('from')}, NOT the checkout (`orch pull --install`)"


def _lag(sg: dict[str, Any]) -> str:
    """``3 behind``, ``diverged (2 local, 3 upstream commits)``, ``mid-merge`` (``git.describe_lag``)."""
    return describe_lag(sg.get("behind"), sg.get("ahead"), sg.get("in_progress"))


def _holders(v: HostStatus) -> list[str]:
    """Who holds which GPUs, each process once: ``GPU 0-7: sglang::scheduler (pid 23657)``."""
    by_name: dict[str, tuple[list[int], list[int]]] = {}
    for g in v.gpus:
        for p in g.processes:
            idx, pids = by_name.setdefault(p["name"], ([], []))
            idx.append(g.index)
            pids.append(p["pid"])
    held = []
    for name, (idx, pids) in by_name.items():
        label = "pid" if len(set(pids)) == 1 else "pids"
        held.append(f"GPU {fmt_ranges(idx)}: {name} ({label} {fmt_ranges(pids)})")
    return held


def _gpu_cell(v: HostStatus) -> str:
    if v.gpu_error:
        return f"error: {v.gpu_error}"
    if not v.gpus:
        return "-"
    used = sum(g.memory_used_mib for g in v.gpus)
    total = sum(g.memory_total_mib for g in v.gpus)
    busy = _holders(v)
    line = f"{len(v.gpus)}× {v.gpus[0].name}, {fmt_mib(used)}/{fmt_mib(total)}"
    return line + (f"; held by {'; '.join(busy)}" if busy else "; idle")


def _made_for(t: dict[str, Any], checkout: str | None) -> str:
    """`` for 8e6290d on NVIDIA RTX PRO 6000 ...``: the commits and devices the installed configs were
    made for, and the checkout's commit when it is another one (the configs may be stale)."""
    made = t.get("installed_for") or {}
    if not made:
        return ""
    commits = sorted({str(r["commit"]) for r in made.values()})
    devices = sorted({str(r["device"]) for r in made.values()})
    moved = f" (checkout now {checkout[:7]})" if checkout and commits != [checkout] else ""
    return f" for {', '.join(c[:7] for c in commits)} on {', '.join(devices)}{moved}"


def _tuning_cell(v: HostStatus) -> str:
    """``orch tune-fp8`` progress: ``running 45% (41/90), ETA 62s``, ``installed 5 shapes for 8e6290d on
    NVIDIA ...``, ``failed: why``; a job stuck after a finished tuner run is named (``orch wait`` stops it), and
    one silent inside a run (``silent_jobs``: it may be hung; only the operator stops it)."""
    t = v.extra.get("tuning")
    if not t:
        return "-"
    if t.get("recorded") is False and t["state"] == "installed":
        return (
            f"installed {len(t['installed'])} shapes{_made_for(t, (v.sglang or {}).get('commit'))}, marked by orch on "
            f"the host but not recorded in this state (`orch tune-fp8 --host {v.name}` checks and records them)"
        )
    if t.get("recorded") is False:
        n = len(t["jobs"])
        return (
            f"running: {n} orch tuning job{'s' * (n > 1)} this state does not record (another controller, or a "
            f"lost state directory; `orch tune-fp8 --host {v.name} --wait` adopts their plan and installs it)"
        )
    if t["state"] in ("running", "ready-to-install"):
        eta = f", ETA {t['eta_seconds']}s" if t.get("eta_seconds") is not None else ""
        done = f"{t['percent']:.0f}% ({t['units_done']}/{t['units_total']})"
        return f"{t['state']} {done}{eta}{_stuck(t)}{_silent(v.name, t)}"
    if t["state"] == "installed":
        by = t.get("installed_by_another")
        other = f", by another orch (plan {by}; `orch wait --host {v.name}` records it)" if by else ""
        made = _made_for(t, (v.sglang or {}).get("commit"))
        return f"installed {len(t['installed'])} shapes{_unrecorded(t)}{made}{other}"
    return f"{t['state']}: {t.get('reason') or t.get('error') or ''}".rstrip(": ")


def _stuck(t: dict[str, Any]) -> str:
    """``, STUCK after a finished tuner run: tune.gpu1-... silent 6m00s (...)``: the jobs ``stuck_jobs`` found."""
    stuck = t.get("stuck") or {}
    if not stuck:
        return ""
    jobs = ", ".join(f"{job_id} silent {_uptime(int(silent))}" for job_id, silent in stuck.items())
    return f", STUCK after a finished tuner run: {jobs} (`orch wait` stops {'it' if len(stuck) == 1 else 'them'})"


def _silent(host: str, t: dict[str, Any]) -> str:
    """``, SILENT inside a tuner run: tune.gpu3-... no output for 9m20s (...)``: the jobs ``silent_jobs`` found."""
    silent = t.get("silent") or {}
    if not silent:
        return ""
    jobs = ", ".join(f"{job_id} no output for {_uptime(int(seconds))}" for job_id, seconds in silent.items())
    first = next(iter(silent))
    return (
        f", SILENT inside a tuner run: {jobs} (hung? `orch logs {host} {first}` shows its log; "
        f"`orch stop {host} {first}` ends it, orch does not)"
    )


def _stopped(s: dict[str, Any], now: datetime | None) -> str:
    ago = _ago(s.get("stopped_at"), now) if now is not None else None
    by = s.get("stopped_by")
    detail = ", ".join(x for x in (f"by {by}" if by else None, ago) if x)
    return f"stopped ({detail})" if detail else "stopped"


def _commits(s: dict[str, Any]) -> str:
    """``runs ed88712, checkout a525317: restart pending`` (or just ``runs ed88712``)."""
    runs, checkout = s.get("commit"), s.get("checkout")
    if not runs:
        return ""
    text = f"runs {runs[:7]}"
    if checkout and checkout != runs:
        text += f", checkout {checkout[:7]}"
    if s.get("restart_pending"):
        newer = len(s.get("configs_since_launch") or [])
        text += ": restart pending" + (f" ({newer} tuned configs installed since launch)" if newer else "")
    return text


def _server_cell(v: HostStatus, now: datetime | None = None) -> str:
    """``healthy, MTP on (accept 3.10), 5 tuned shapes, up 2h03m, job server-...; runs 8e6290d`` (``healthy,
    profile balanced, ...`` served as a playbook's serving profile), or why it is down, or ``stopped (by orch
    stop-server, 2 h ago)``."""
    s = v.extra.get("server")
    if not s:
        return "-"
    rank = _rank_words(s)
    if s.get("job_state") == "stopped":
        return f"{_stopped(s, now)}, job {s['job']}{rank}"
    if not s["healthy"]:
        unrecorded = " (not recorded in this state database)" if s.get("recorded") is False else ""
        return f"NOT healthy (job {s['job']}: {_ended(s['job_state'])}){rank}{unrecorded}"
    simulated = ", simulated" if s.get("simulated") else ""
    accept = f" (accept {s['accept_length']:.2f}{simulated})" if s.get("accept_length") is not None else ""
    mtp = f"MTP on{accept}" if s["mtp"] else "MTP off"
    uptime = _uptime(s.get("uptime_s") or 0)
    commits = _commits(s)
    shapes = f"{len(s['tuned_shapes_in_use'])} tuned shapes" if s.get("verified", True) else "tuned shapes not verified"
    profile = f"profile {s['profile']}, " if s.get("profile") else ""
    line = f"healthy, {profile}{mtp}, {shapes}, up {uptime}, job {s['job']}{rank}"
    if s.get("recorded") is False:
        line += " (not recorded in this state database: started by another controller or state directory)"
    line = f"{line}; {commits}" if commits else line
    return f"{line}; resolved: {s['resolved']}" if s.get("resolved") else line


def _rank_words(s: dict[str, Any]) -> str:
    """``, rank 1 of group pro-1`` (``, rank 0 of group pro-1, serving its HTTP``) for a replica group's rank
    (one this state does not record named by ``ops.status.name_unrecorded_ranks``), ``, rank 1 of 2 nodes``
    for one no group of the inventory claims; else ``""``."""
    if s.get("rank") is None:
        return ""
    of = f"group {s['group']}" if s.get("group") else f"{s.get('nnodes', '?')} nodes"
    of += " (not a group of the inventory)" if s.get("grouped") is False else ""
    return f", rank {s['rank']} of {of}" + (", serving its HTTP" if s["rank"] == 0 else "")


def _gateway_cell(v: HostStatus) -> str | None:
    """``registered, healthy``, ``registered, UNHEALTHY``, ``registered, draining`` (being removed),
    ``drained`` (``orch drain``: out on purpose), ``not registered``, ``out: rolling relaunch`` (a live rollout
    took it out), ``rank 1 of pro-1: via rank 0`` (a replica group's other rank: never a worker),
    ``gateway unreachable``; None without a gateway in the inventory (no column)."""
    g = v.extra.get("gateway")
    if g is None:
        return None
    if not g["reachable"]:
        return "gateway unreachable"
    if not g["registered"] and g.get("rank"):
        return f"{g['rank']}: via rank 0"
    if not g["registered"]:
        return (
            "drained" if "drained_at" in v.extra else "out: rolling relaunch" if g.get("out_for") else "not registered"
        )
    if g.get("draining"):
        return "registered, draining"
    return "registered, healthy" if g["healthy"] else "registered, UNHEALTHY"


def gateway_notes(views: list[HostStatus], gateway: dict[str, Any] | None) -> list[str]:
    """The lines about the gateway under the table: hosts out of step with it (serving but not registered,
    registered but not serving), hosts a live rollout took out, workers that are no inventory host, why it did
    not answer."""
    if gateway is None:
        return []
    if not gateway["reachable"]:
        return [str(gateway["error"])]  # it names the gateway
    flagged = [f"{v.name}: gateway: {g['flag']}" for v in views if (g := v.extra.get("gateway")) and g.get("flag")]
    out = [
        f"{v.name}: gateway: {out_for_rollout(g['out_for'])}"
        for v in views
        if (g := v.extra.get("gateway")) and g.get("out_for")
    ]
    return (
        flagged + out + [f"gateway: {url} is registered but no inventory host" for url in gateway["not_in_inventory"]]
    )


# -- the default table: one short line per host ------------------------------------------------------------


def _state_short(v: HostStatus) -> str:
    return v.phase if v.reachable else "unreachable"


def _sglang_short(v: HostStatus, now: datetime) -> str:
    """``8e6290d 3 behind, 2h ago``: the commit, the commits behind upstream and when it was fetched."""
    if not v.sglang:
        return "-"
    sg = v.sglang
    lag = _lag(sg)
    ago = _ago(sg.get("fetched_at"), now, short=True)
    return f"{str(sg.get('commit'))[:7]} {lag}, {ago or 'never fetched'}"


def _gpu_short(v: HostStatus) -> str:
    """``8× idle``, ``8× busy 84%``, ``8×, 3 busy 30%`` (the share of GPU memory in use)."""  # noqa: RUF002
    if v.gpu_error:
        return "error"
    if not v.gpus:
        return "-"
    busy = sum(1 for g in v.gpus if g.processes)
    total = sum(g.memory_total_mib for g in v.gpus)
    used = 100 * sum(g.memory_used_mib for g in v.gpus) // total if total else 0
    if not busy:
        return f"{len(v.gpus)}× idle"
    return f"{len(v.gpus)}× busy {used}%" if busy == len(v.gpus) else f"{len(v.gpus)}×, {busy} busy {used}%"


def _tuning_short(v: HostStatus) -> str:
    t = v.extra.get("tuning")
    if not t:
        return "-"
    if t.get("recorded") is False:
        return (
            f"installed {len(t['installed'])} (not recorded)" if t["state"] == "installed" else "running (not recorded)"
        )
    if t["state"] in ("running", "ready-to-install"):
        eta = f" ETA {_uptime(int(t['eta_seconds']))}" if t.get("eta_seconds") else ""
        stuck = " STUCK" if t.get("stuck") else " SILENT" if t.get("silent") else ""
        return f"{t['state']} {t['percent']:.0f}% ({t['units_done']}/{t['units_total']}){eta}{stuck}"
    if t["state"] == "installed":
        return f"installed {len(t['installed'])}{_unrecorded(t)}"
    return str(t["state"])


def _unrecorded(t: dict[str, Any]) -> str:
    """`` (3 not recorded)``: installed configs orch marked on the host that this state does not record."""
    return f" ({len(t['unrecorded'])} not recorded)" if t.get("unrecorded") else ""


def _ended(job_state: str) -> str:
    """A server job's state in words: one that ``succeeded`` ended with exit 0, unasked (a server does not end)."""
    return "ended, exit 0" if job_state == "succeeded" else job_state


def _server_short(v: HostStatus, now: datetime) -> str:
    """``healthy, MTP 3.10, up 2h``, ``healthy, restart pending``, ``stopped (by ..., 2 h ago)``,
    ``NOT healthy (failed)``."""
    s = v.extra.get("server")
    if not s:
        return "-"
    if s.get("job_state") == "stopped":
        return _stopped(s, now)
    if not s["healthy"]:
        return f"NOT healthy ({_ended(s['job_state'])}{', not recorded' if s.get('recorded') is False else ''})"
    if s.get("restart_pending"):
        return "healthy, restart pending"
    accept = f" {s['accept_length']:.2f}" if s.get("accept_length") is not None else " on"
    up = s.get("uptime_s") or 0
    uptime = f"{up // 3600}h" if up >= 3600 else f"{up // 60}m"
    unrecorded = " (not recorded in this state database)" if s.get("recorded") is False else ""
    return f"healthy, MTP{accept if s['mtp'] else ' off'}, up {uptime}{unrecorded}"


STATUS_COLUMNS = ["host", "state", "sglang (fetched)", "gpus", "tuning", "server"]


def status_row(v: HostStatus, now: datetime) -> list[str]:
    """One host's line of the default table: short cells, details in ``--wide`` and ``orch status HOST``;
    the gateway cell last, with a gateway in the inventory."""
    row = [v.name, _state_short(v), _sglang_short(v, now), _gpu_short(v), _tuning_short(v), _server_short(v, now)]
    return _with_gateway(row, v)


def _with_gateway(row: list[str], v: HostStatus) -> list[str]:
    gateway = _gateway_cell(v)
    return row if gateway is None else [*row, gateway]


def _columns(base: list[str], views: list[HostStatus]) -> list[str]:
    return [*base, "gateway"] if any("gateway" in v.extra for v in views) else base


def status_notes(views: list[HostStatus], short_cells: bool = True) -> list[str]:
    """Lines under the table for what needs the operator: unreachable hosts with the fix (an unknown host
    key: `orch trust HOST`), a checkout that cannot be read, a failed ``--fetch``; with ``short_cells``
    (under the default table) also what its cells only hint at: a pending restart, why tuning failed or which
    job is stuck or silent, why the GPUs could not be read; a relaunch cut off with nothing serving."""
    notes = []
    for v in views:
        problems = [v.error.removeprefix(f"{v.name}: ")] if v.error else []
        if v.hint:
            problems.append(f"hint: {v.hint}")
        if v.extra.get("fetch_error"):
            problems.append(str(v.extra["fetch_error"]))
        server, tuning = v.extra.get("server") or {}, v.extra.get("tuning") or {}
        if short_cells and server.get("restart_pending"):
            problems.append(f"server {_commits(server)}")
        plain = "--no-rolling " if "drained_at" in v.extra else ""  # a rolling serve leaves a drained host out
        needs_you = tuning.get("state") in ("failed", "unknown") or tuning.get("stuck") or tuning.get("silent")
        if short_cells and needs_you:
            problems.append(f"tuning {_tuning_cell(v)}")
        if server.get("ended_while_serving"):
            job, group = server["job"], server.get("group")
            again = f"serves its group {group} again (every rank: one command)" if group else "serves again"
            if server.get("grouped") is False:  # no group of the inventory: a serve of this host serves it alone
                of = f"group {group}" if group else f"a {server.get('nnodes', '?')}-node server"
                again = f"would serve {v.name} alone (it ran rank {server['rank']} of {of}: the inventory no "
                again += "longer groups its ranks)"
            problems.append(
                f"server job {job} ended ({server['job_state']}) while recorded serving, not stopped by orch: nothing "
                f"serves; `orch logs {v.name} {job}` shows why, `orch serve {plain}--host {v.name}` {again}"
            )
        if server.get("ended_unasked"):
            job = server["job"]
            problems.append(
                f"server job {job} ended ({_ended(server['job_state'])}) not stopped by orch, and not recorded in this "
                f"state database (started by another controller or state directory): nothing serves; `orch logs "
                f"{v.name} {job}` shows why, `orch serve --host {v.name}` serves again"
            )
        if v.phase == "launching" and server.get("job_state") != "running" and v.reachable:
            problems.append(
                "phase launching, but no server of orch's runs: a serve (or sweep) is between stopping the old server "
                f"and starting the new one, or was cut off there; when no such command runs, `orch serve {plain}--host "
                f"{v.name}` (or the same command) serves again"
            )
        elif v.phase == "launching" and v.reachable and server.get("healthy"):  # starting: nothing to say
            profile = f" --profile {server['profile']}" if server.get("profile") else ""
            problems.append(
                f"phase launching while server job {server['job']} is healthy: a serve (or sweep) is verifying it, "
                f"or was cut off before; when no such command runs, `orch serve {plain}--host {v.name}{profile}` (or "
                "the same command) re-attaches to it and verifies it"
            )
        if short_cells and v.gpu_error:
            problems.append(f"gpus: {v.gpu_error}")
        notes += [f"{v.name}: {p}" for p in problems]
    return notes


def compact_table(views: list[HostStatus], now: datetime) -> Table:
    """The default ``orch status`` table: one line per host. Host, state and sglang are never cut; when the
    terminal is too narrow, the widest other cells are cut with … (never wrapped onto a second line)."""
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for i, c in enumerate(_columns(STATUS_COLUMNS, views)):
        t.add_column(c, no_wrap=i < 3)  # the others may shrink; their Text cells cut rather than wrap
    for v in views:
        t.add_row(*(Text(inert(cell), no_wrap=True, overflow="ellipsis") for cell in status_row(v, now)))
    return t


def status_table(
    views: list[HostStatus],
    wide: bool = False,
    now: datetime | None = None,
    gateway: dict[str, Any] | None = None,
    groups: Sequence[GroupStatus] = (),
) -> None:
    """Print the status table (``wide``: every detail, cells wrapped), one line per replica group
    (``groups``), and the notes under it (``gateway``: what ``ops.status.gateway_column`` found, None
    without a gateway in the inventory)."""
    from orchestrator.render import out

    now = now or datetime.now(timezone.utc)
    if wide:
        rows = [_wide_row(v, now) for v in views]
        columns = ["host", "address", "reachable", "phase", "sglang", "gpus", "tuning", "server"]
        table(None, _columns(columns, views), rows)
    else:
        out.print(compact_table(views, now))
    for line in [g.line() for g in groups]:
        out.print(inert(line), markup=False, soft_wrap=False)
    notes = [
        *status_notes(views),
        *gateway_notes(views, gateway),
        *stale_fetch_note(views, now),
        *simulated_note(views),
    ]
    for note in notes:
        out.print(inert(note), markup=False, soft_wrap=False)  # wrapped at the terminal's width, as the table


def simulated_note(views: list[HostStatus]) -> list[str]:
    """One line naming the hosts whose server is orch's simulated SGLang: their accept lengths and GPU load
    are the simulator's numbers, not a GPU's (the table's cells are too narrow to say it on each)."""
    names = [v.name for v in views if (v.extra.get("server") or {}).get("simulated")]
    if not names:
        return []
    return [f"simulated (orch's simulated SGLang: accept length and GPU load are its model's): {', '.join(names)}"]


STALE_FETCH = timedelta(days=1)


def stale_fetch_note(views: list[HostStatus], now: datetime) -> list[str]:
    """One line naming the reachable hosts whose upstream was last fetched over a day ago (or never):
    their commits behind may be far from the truth, and ``--fetch`` fixes that."""
    stale = []
    for v in views:
        fetched = _when((v.sglang or {}).get("fetched_at"))
        if v.reachable and v.sglang and (fetched is None or now - fetched > STALE_FETCH):
            stale.append(v.name)
    if not stale:
        return []
    names = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
    return [f"upstream last fetched over a day ago on {names}: `orch status --fetch` counts commits behind as of now"]


def _wide_row(v: HostStatus, now: datetime) -> list[str]:
    reach = "yes" if v.reachable else f"NO: {(v.error or '').removeprefix(f'{v.name}: ')}"
    if v.reachable and v.error:
        reach = f"yes ({v.error})"
    row = [v.name, v.address, reach, v.phase, _sglang_cell(v, now), _gpu_cell(v), _tuning_cell(v), _server_cell(v, now)]
    return _with_gateway(row, v)


def status_details(views: list[HostStatus], gateway: dict[str, Any] | None = None, now: datetime | None = None) -> None:
    """``orch status HOST``: every detail of each host, one labelled line per part."""
    from orchestrator.render import out

    now = now or datetime.now(timezone.utc)
    for i, v in enumerate(views):
        if i:
            out.print("")
        for line in detail_lines(v, now):
            out.print(inert(line), markup=False)
        for note in gateway_notes([v], gateway):
            out.print(inert(f"  {note.removeprefix(f'{v.name}: ')}"), markup=False)


def detail_lines(v: HostStatus, now: datetime) -> list[str]:
    seen = _ago(v.last_seen, now)
    reach = "reachable" if v.reachable else f"UNREACHABLE (last seen {seen or 'never'})"
    lines = [f"{v.name} ({v.address}): {reach}, phase {v.phase}"]
    parts = [
        ("sglang", _sglang_cell(v, now)),
        ("gpus", _gpu_cell(v)),
        ("tuning", _tuning_cell(v)),
        ("server", _server_cell(v, now)),
        *([("gateway", gateway)] if (gateway := _gateway_cell(v)) is not None else []),
    ]
    lines += [f"  {label:<8}{text}" for label, text in parts]
    lines += [f"  {note.removeprefix(f'{v.name}: ')}" for note in status_notes([v], short_cells=False)]
    return lines
