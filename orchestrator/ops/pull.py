"""``orch pull``: fast-forward the host's SGLang checkout to its upstream, or refuse and change nothing.

Refusals (exit 3 for that host, the checkout untouched): tracked files with uncommitted changes, a
detached HEAD, a branch that has diverged from upstream, or a move under orch's running tuning jobs. A
checkout already at (or ahead of) upstream is success. The fast-forward runs under the state lock and is
recorded in that transaction: when the lock cannot be had (exit 4) the checkout has not moved. Phase
becomes ``pulled`` when the commit changed, or when the host was new or failed; a serving host whose
checkout did not move keeps its phase. The session forgets what a pull changes: the checkout (``git``: a
fetch alone changes the commits behind), and when the commit moved or ``--install`` ran, the SGLang code
the server's flags and the tuned-config directory are read from. A pull that moves some hosts of a replica
group reads the others' commits after it (``split_groups``): a group left at two commits is said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator import jobs, readers
from orchestrator.errors import RefusedError
from orchestrator.facts import git
from orchestrator.facts import tuner as tuner_facts
from orchestrator.fleet import Fleet, FleetResult
from orchestrator.inventory import Host, Inventory
from orchestrator.session import HostSession
from orchestrator.state import HostState
from orchestrator.transport.base import Runner, shell_command

CHANGED_WITH_THE_CODE = ("server_surface", "parses", "tuned_configs", "replacement")  # read from the host's SGLang


@dataclass
class PullResult:
    old: str
    new: str
    commits: list[tuple[str, str]] = field(default_factory=list)  # (short sha, subject), newest first
    ahead: int = 0
    installed: bool = False
    branch: str = ""  # the local branch that was fast-forwarded (the one checked out)
    upstream: str = ""
    install_needed: bool = False  # the package's pins changed (python/pyproject.toml) and no install ran

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass(frozen=True)
class SplitGroup:
    """A replica group a pull left at two commits: ``pulled`` (host -> its new commit) moved, ``others``
    (host -> its commit as read after the pull, None when it could not be read) were not pulled."""

    name: str
    pulled: dict[str, str]
    others: dict[str, str | None]


def split_groups(fleet: Fleet, inventory: Inventory, results: FleetResult[PullResult]) -> list[SplitGroup]:
    """The replica groups this pull left at different commits: a host of the group moved, and the group's
    hosts not pulled (their checkouts read now, in one round trip each) are not all at its new commit."""
    moved = {r.host.name: r.value.new for r in results.succeeded if r.value is not None and r.value.changed}
    touched = [g for g in inventory.groups.values() if any(name in moved for name in g.hosts)]
    others = [inventory.hosts[name] for g in touched for name in g.hosts if name not in moved]
    read = fleet.map(lambda host, runner: readers.read_git(host, runner).commit, others) if others else []
    commits = {r.host.name: r.value for r in read}
    split = []
    for g in touched:
        pulled = {name: moved[name] for name in g.hosts if name in moved}
        behind = {name: commits[name] for name in g.hosts if name not in moved}
        if behind and len({*pulled.values(), *behind.values()}) > 1:
            split.append(SplitGroup(g.name, pulled, behind))
    return split


def plan(host: Host, install: bool) -> list[list[str]]:
    """The remote commands a pull runs (for ``--dry-run``), in order."""
    d = host.sglang_dir
    steps = [
        git.info_argv(d, host.upstream),
        git.dirty_argv(d),
        git.fetch_argv(d, host.remote),
        git.behind_ahead_argv(d, host.upstream),
        git.fast_forward_argv(d, host.upstream),
        git.log_argv(d, "OLD", "NEW"),
    ]
    if install:
        steps.append(install_argv(host))
    return steps


READ_SHOWN = "<orch's read of the checkout: commit, branch, subject, upstream, behind and ahead, when fetched>"
"""How ``--dry-run`` shows the read-only script that reads the checkout (``git.info_argv``: 19 lines of shell)."""


def dry_run_lines(host: Host, install: bool) -> list[str]:
    """The pull's commands, one line each: the checkout read (read-only) by what it reads, not its script."""
    steps = plan(host, install)
    steps[0] = [READ_SHOWN if arg == steps[0][2] else arg for arg in steps[0]]
    return [shell_command(argv, env=host.env or None) for argv in steps]


def install_argv(host: Host) -> list[str]:
    return [host.python, "-m", "pip", "install", "-e", f"{host.sglang_dir.rstrip('/')}/python"]


def pull(session: HostSession, install: bool = False) -> PullResult:
    host, runner = session.host, session.runner
    before = session.git()
    _refuse_unsafe(host, runner, before)
    session.forget("git")  # from the fetch on, the checkout is no longer what was read
    runner.run(git.fetch_argv(host.sglang_dir, host.remote), check=True, timeout=600)
    behind, ahead = _check_not_diverged(host, runner)
    if behind:  # the checkout would move (diverged was refused)
        _refuse_under_tuning(session, before, behind)
    result = PullResult(before.commit, before.commit, ahead=ahead, branch=before.branch, upstream=host.upstream)
    _fast_forward(session, result)
    if result.changed:
        session.forget(*CHANGED_WITH_THE_CODE)
        log = runner.run(git.log_argv(host.sglang_dir, before.commit, result.new), check=True)
        result.commits = git.parse_log(log.stdout)
        pins = runner.run(git.changed_argv(host.sglang_dir, before.commit, result.new, git.PACKAGE_PINS), check=True)
        result.install_needed = bool(pins.stdout.strip()) and not install
    if install:
        session.forget(*CHANGED_WITH_THE_CODE)
        runner.run(install_argv(host), cwd=host.sglang_dir, check=True, timeout=1800)
        result.installed = True
    return result


def _fast_forward(session: HostSession, result: PullResult) -> None:
    """Move the checkout, then record where it is. The state is checked writable first: a state orch
    cannot write (another orch holds it too long: ``StateError``, exit 4) means the checkout did not
    move. The fast-forward runs outside the transaction, which would hold every other writer up."""
    host = session.host
    session.store.check_writable()
    if result.ahead == 0:
        session.runner.run(git.fast_forward_argv(host.sglang_dir, host.upstream), check=True, timeout=300)
    after = session.git()
    result.new = after.commit
    session.store.update_host(host.name, lambda hs: _record(hs, host, after, result))


def _refuse_unsafe(host: Host, runner: Runner, info: git.GitInfo) -> None:
    dirty = git.parse_dirty(runner.run(git.dirty_argv(host.sglang_dir), check=True).stdout)
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise RefusedError(
            f"{host.name}: {host.sglang_dir} has uncommitted changes to tracked files ({shown}); nothing changed",
            hint="commit or stash them on the host (git stash), then pull again",
        )
    if info.branch == "HEAD":
        raise RefusedError(
            f"{host.name}: {host.sglang_dir} is on a detached HEAD ({info.short}); nothing changed",
            hint=f"check out the branch that follows {host.upstream} (git checkout {host.branch}), then pull again",
        )


def _refuse_under_tuning(session: HostSession, before: git.GitInfo, behind: int) -> None:
    """Refuse to move a checkout (``behind`` commits) that orch's tuning jobs run on: each tuner call (one per
    shape) imports SGLang from it anew, so later calls would tune another commit's kernels, and every config be
    recorded as tuned for ``before``. Asked only of a checkout that would move."""
    host = session.host
    tuning = jobs.running(session.jobs(), tuner_facts.JOB_PURPOSE_PREFIX)
    if tuning:
        raise RefusedError(
            f"{host.name}: {len(tuning)} tuning jobs of orch's run on {host.sglang_dir} ({tuning[0].id} ...): moving "
            f"it {behind} commits now would run their later tuner calls on other code, their configs recorded as "
            f"tuned for {before.short}; nothing changed",
            hint=f"pull once they have ended (`orch wait --host {host.name}` follows them and installs their "
            f"configs), or stop them (`orch stop {host.name} JOB`)",
        )


def _check_not_diverged(host: Host, runner: Runner) -> tuple[int, int]:
    """The commits upstream has that HEAD lacks and the local ones upstream lacks (behind, ahead), in one
    command; refuse a divergence (both), or an upstream that is no commit in the checkout."""
    d = host.sglang_dir
    counted = runner.run(git.behind_ahead_argv(d, host.upstream))
    if not counted.ok:  # git could not read the upstream
        raise RefusedError(
            f"{host.name}: upstream {host.upstream} is not a commit in {d} after fetching {host.remote} "
            f"({git.fetch_error_line(counted.stderr)}); nothing changed",
            hint=f"check `upstream` for {host.name} in the inventory: remote/branch, e.g. origin/main "
            f"(`git -C {d} branch -r` lists the remote's branches)",
        )
    behind, ahead = git.parse_behind_ahead(counted.stdout)
    if behind and ahead:
        raise RefusedError(
            f"{host.name}: branch has diverged from {host.upstream} ({ahead} local, {behind} upstream commits); "
            "nothing changed",
            hint="rebase or reset the checkout on the host by hand, then pull again",
        )
    return behind, ahead


def _record(hs: HostState, host: Host, info: git.GitInfo, result: PullResult) -> None:
    hs.sglang = readers.sglang_info(host, info)
    hs.last_seen = datetime.now(timezone.utc)  # orders this reading after any status that started earlier
    hs.pulled(result.old, result.new)
