"""``Recipe.campaign``: what ``orch run`` records its done steps under, so that a re-run resumes its own campaign
and no other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.recipe import PACKAGED_PLAYBOOKS, load_recipe

SHIPPED = (PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text()


def test_one_file_named_two_ways_is_one_campaign_and_another_file_or_an_edit_is_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch run pb/camp.yaml` from another directory said `done nothing new (already done: pull, tune-fp8,
    serve)` of a different file, which was never served; the same file by its absolute path ran everything again."""
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "camp.yaml").write_text(SHIPPED)
    monkeypatch.chdir(tmp_path)
    relative = load_recipe(Path("pb/camp.yaml")).campaign
    assert load_recipe(tmp_path / "pb" / "camp.yaml").campaign == relative
    monkeypatch.chdir(tmp_path / "pb")
    assert load_recipe(Path("camp.yaml")).campaign == relative

    other = tmp_path / "other" / "pb"
    other.mkdir(parents=True)
    (other / "camp.yaml").write_text(SHIPPED)
    monkeypatch.chdir(tmp_path / "other")
    assert load_recipe(Path("pb/camp.yaml")).campaign != relative  # the same relative path, another file

    (tmp_path / "pb" / "camp.yaml").write_text(SHIPPED.replace("mem-fraction-static: 0.85", "mem-fraction-static: 0.8"))
    assert load_recipe(tmp_path / "pb" / "camp.yaml").campaign != relative  # edited: its steps run again
    assert os.path.isabs(relative.split(" (sha256 ")[0])


def test_the_next_round_hint_names_a_playbook_as_orch_run_finds_it(tmp_path: Path) -> None:
    """`orch run pb/camp.yaml` ended with `orch run camp --from pull`, which finds no playbook `camp`."""
    from types import SimpleNamespace

    from orchestrator.inventory import Host
    from orchestrator.ops.run import _playbook_arg

    (tmp_path / "pb").mkdir()
    (tmp_path / "playbooks").mkdir()
    for where in ("pb", "playbooks"):
        (tmp_path / where / "camp.yaml").write_text(SHIPPED)
    host = Host(name="h", address="127.0.0.1")
    for where, said in (("pb", str(tmp_path / "pb" / "camp.yaml")), ("playbooks", "camp")):
        recipe = load_recipe(tmp_path / where / "camp.yaml")
        assert _playbook_arg(SimpleNamespace(recipe=lambda h, r=recipe: r), host) == said  # type: ignore[arg-type]
    (tmp_path / "playbooks" / "camp2").write_text(SHIPPED)  # read as a path (./playbooks/camp2): its name finds none
    recipe = load_recipe(tmp_path / "playbooks" / "camp2")
    said = str(tmp_path / "playbooks" / "camp2")
    assert _playbook_arg(SimpleNamespace(recipe=lambda h, r=recipe: r), host) == said  # type: ignore[arg-type]


def test_a_comment_is_the_same_campaign_and_a_changed_value_is_said_before_its_steps_run_again(tmp_path: Path) -> None:
    """A comment added to a playbook ran every step of its campaign again, saying nothing of why."""
    from types import SimpleNamespace

    from orchestrator.inventory import Host
    from orchestrator.ops.run import _say_changed_playbook
    from orchestrator.store import StateStore

    path = tmp_path / "camp.yaml"
    path.write_text(SHIPPED)
    first = load_recipe(path)
    path.write_text("# tuned on 2026-12-06\n" + SHIPPED.replace("model:", "model:  ", 1))  # a comment, the layout
    assert load_recipe(path).campaign == first.campaign
    store = StateStore(tmp_path / "state.db")
    store.update_host("h", lambda hs: hs.progress(first.campaign).step_done("pull"))
    path.write_text(SHIPPED.replace("mem-fraction-static: 0.85", "mem-fraction-static: 0.8"))
    changed = load_recipe(path)
    heard: list[str] = []
    fleet = SimpleNamespace(session=lambda h, s: SimpleNamespace(say=heard.append))
    for recipe in (first, changed):
        ctx = SimpleNamespace(store=store, playbook=lambda h, r=recipe: r.campaign, fleet=fleet)
        _say_changed_playbook(ctx, [Host(name="h", address="127.0.0.1")])  # type: ignore[arg-type]
    assert heard == [
        f"{path} asks something else than when its steps were recorded here (sha256 {first.digest} -> "
        f"{changed.digest}): a new campaign, its steps run again"
    ]
