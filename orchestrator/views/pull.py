"""What `orch pull` shows: the commits each host moved by."""

from __future__ import annotations

from orchestrator import render
from orchestrator.fleet import FleetResult
from orchestrator.ops.pull import PullResult, SplitGroup
from orchestrator.render import inert


def pull_report(results: FleetResult[PullResult]) -> None:
    for r in results.succeeded:
        p = r.value
        assert p is not None
        if not p.changed:
            note = f" ({p.ahead} local commits ahead of upstream)" if p.ahead else ""
            on = f"branch {p.branch} " if p.branch else ""
            render.out.print(f"{r.host.name}: {on}already up to date at {p.new[:10]}{note}", markup=False)
            continue
        branch = f"branch {p.branch} fast-forwarded to {p.upstream}: " if p.branch else ""
        render.out.print(
            f"{r.host.name}: {branch}{p.old[:10]} → {p.new[:10]}, {len(p.commits)} new "
            f"commit{'s' if len(p.commits) != 1 else ''}:",
            markup=False,
        )
        for sha, subject in p.commits:
            render.out.print(inert(f"    {sha} {subject}"), markup=False)
    for r in results.succeeded:
        if r.value is not None and r.value.install_needed:
            render.out.print(
                f"{r.host.name}: python/pyproject.toml changed (the package's pins): an install is needed before "
                f"serving: `orch pull --install --host {r.host.name}`",
                markup=False,
            )
        if r.value is not None and r.value.installed:
            render.out.print(f"{r.host.name}: installed with `pip install -e python` ({r.host.python})", markup=False)


def split_groups_report(groups: list[SplitGroup]) -> None:
    """On stderr, each replica group the pull left at two commits, and the pull that joins them: a server of
    the group runs on (said whether or not one runs: the pull did not look), but ``orch serve`` refuses the
    group until its ranks run one commit."""
    for g in groups:
        pulled = ", ".join(f"{name} {commit[:10]}" for name, commit in g.pulled.items())
        others = ", ".join(
            f"{name} {commit[:10] if commit else '(could not be read)'}" for name, commit in g.others.items()
        )
        hosts = " ".join(f"--host {name}" for name in g.others)
        render.err.print(
            f"group {g.name}: its hosts are now at different commits (pulled: {pulled}; not pulled: {others}); a "
            f"server of the group runs on as it started, but `orch serve` refuses the group until every rank is "
            f"at one commit: `orch pull {hosts}`",
            markup=False,
        )
