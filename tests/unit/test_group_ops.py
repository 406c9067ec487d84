"""``ops.group.would_replace``'s decision for its two askers (orch run's read-only question, the rolling
relaunch's checked one), the rank reads replaced by fakes; the integration tests
(tests/integration/test_groups.py, test_groups_gateway.py) run them against the simulated group."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import run_command
from orchestrator.errors import ExitCode, RefusedError
from orchestrator.facts.group import GroupPlan
from orchestrator.ops import group as group_op
from orchestrator.recipe import Recipe, ServeOptions

PLAN = GroupPlan(group="pro-1", hosts=("b1", "b2"), dist_init_addr="10.0.0.2:20000")
RANK = group_op.Rank(PLAN, 0)


class Ranks:
    """What the fakes were asked: which ranks were built, and which hosts' replacement was checked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, serving: bool, adoptable: bool, refuse: str = "") -> None:
        self.asked: list[str] = []
        ranks = [group_op.RankReady(Fake(n), i, None) for i, n in enumerate(PLAN.hosts)]  # type: ignore[arg-type]

        def built(how: str) -> Any:
            return lambda *args: self.asked.append(how) or ranks

        def check(session: Fake, ready: object) -> None:
            self.asked.append(f"check {session.name}")
            if session.name == refuse:
                raise RefusedError(
                    f"{refuse}: the new server cannot start here (the running server was left untouched)"
                )

        monkeypatch.setattr(group_op, "checked_ranks", built("checked"))
        monkeypatch.setattr(group_op, "looked_ranks", built("looked"))
        monkeypatch.setattr(group_op, "already_serving", lambda *args: object() if serving else None)
        monkeypatch.setattr(group_op, "recorded", lambda ranks: {})
        monkeypatch.setattr(group_op, "adoptable", lambda *args: {"b1": "j0"} if adoptable else None)
        monkeypatch.setattr(group_op.serve_op, "check_replacement", check)


class Fake:
    def __init__(self, name: str) -> None:
        self.name = name


def ask(checked: bool, force: bool = False) -> bool:
    options = ServeOptions(force=force)
    return group_op.would_replace(Fake("b1"), Recipe(model="m", architecture="a"), options, RANK, Fake, checked)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("checked", "serving", "adoptable", "force", "replaces", "asked"),
    [
        # orch run's question reads only
        (False, False, False, False, True, ["looked"]),
        (False, True, False, False, False, ["looked"]),
        (False, False, True, False, False, ["looked"]),  # serve re-attaches to the cut-off launch: nothing stops
        (False, True, False, True, True, []),  # --force: nothing read
        # the rolling relaunch's question checks every rank it would replace
        (True, False, False, False, True, ["checked", "check b1", "check b2"]),
        (True, True, False, False, False, ["checked"]),
        (True, False, True, False, True, ["checked"]),  # counted as replaced: serve waits for the cut-off ranks
        (True, True, True, True, True, ["checked", "check b1", "check b2"]),
    ],
)
def test_would_replace_asks_what_its_asker_needs(
    monkeypatch: pytest.MonkeyPatch,
    checked: bool,
    serving: bool,
    adoptable: bool,
    force: bool,
    replaces: bool,
    asked: list[str],
) -> None:
    ranks = Ranks(monkeypatch, serving, adoptable)
    assert ask(checked, force) is replaces
    assert ranks.asked == asked


def test_a_rank_that_cannot_start_refuses_the_rolling_relaunch_naming_the_group_not_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Ranks(monkeypatch, serving=False, adoptable=False, refuse="b2")
    with pytest.raises(RefusedError) as refused:
        ask(checked=True)
    assert str(refused.value) == (
        "group pro-1 (not touched): b2: the new server cannot start here (the running server was left untouched)"
    )


def test_recipe_show_of_a_group_host_is_its_ranks_command_and_a_multi_node_recipe_alone_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`orch recipe show` printed the single-host command for each rank (rank 1 with a --port it never gets,
    no --nnodes, no interface variables), and for a 2-node recipe on a host alone a command serve refuses."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "hosts:\n  b1: {address: 10.0.0.1}\n  b2: {address: 10.0.0.2}\n  alone: {address: 10.0.0.3}\n"
        "groups:\n  pro-1: {hosts: [b1, b2], playbook: deepseek-v4-pro, network_interface: ens1f0np0}\n"
    )
    assert run_command(["-i", str(inventory), "recipe", "show", "--host", "b2"]) == 0
    b2, place, command, *_ = capsys.readouterr().out.splitlines()
    assert b2.startswith("b2: ") and b2.endswith("deepseek-v4-pro.yaml")
    assert place == "  (group pro-1: rank 1 of 2, rank 0 is b1; the ranks meet at 10.0.0.1:20000)"
    argv = shlex.split(command.removeprefix("  $ "))
    assert argv[:3] == ["env", "NCCL_SOCKET_IFNAME=ens1f0np0", "GLOO_SOCKET_IFNAME=ens1f0np0"]
    assert "--port" not in argv and argv[-6:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.1:20000",
    ]
    code = run_command(["-i", str(inventory), "recipe", "show", "--host", "alone", "--playbook", "deepseek-v4-pro"])
    said = capsys.readouterr()
    assert code == ExitCode.USAGE and said.out == ""
    assert "alone: " in said.err and "runs on 2 hosts at once, and alone is in no group of " in said.err
