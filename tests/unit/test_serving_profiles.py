"""Serving profiles in playbooks (``profiles:``) and ``orch serve --profile`` (issue 25 §3)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.facts import server
from orchestrator.inventory import Host
from orchestrator.recipe import PACKAGED_PLAYBOOKS, ProfileOptions, SweepOptions, load_recipe
from tests.conftest import OrchRun

SHIPPED = PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml"
HOST = Host(name="h", address="127.0.0.1", model_path="/m", python="/py")


def argv_of(profile: str) -> list[str]:
    served = load_recipe(SHIPPED).with_profile(profile)
    return server.launch_argv(served, HOST, mtp=served.mtp is not None)


def test_shipped_profiles_follow_upstreams_recipes_by_concurrency() -> None:
    low, balanced, high = argv_of("low-latency"), argv_of("balanced"), argv_of("max-throughput")
    assert "--enable-dp-attention" not in low and "--disable-flashinfer-autotune" in low
    assert low[low.index("--speculative-num-draft-tokens") + 1] == "4"
    assert balanced[balanced.index("--speculative-num-steps") + 1] == "1"
    assert balanced[balanced.index("--speculative-num-draft-tokens") + 1] == "2"
    assert balanced[balanced.index("--dp-size") + 1] == "8" and "--enable-dp-attention" in balanced
    assert "--disable-flashinfer-autotune" not in balanced  # the autotune runs at launch
    assert not any(a.startswith("--speculative") for a in high) and "--enable-dp-attention" in high
    for name in ("low-latency", "balanced", "max-throughput"):
        served = load_recipe(SHIPPED).with_profile(name)
        assert server.check_recipe(served, mtp=served.mtp is not None) == []
        assert served.server_args["tp-size"] == 8  # the base arguments stay


def test_a_profile_without_an_mtp_key_keeps_the_base_block(tmp_path: Path) -> None:
    text = SHIPPED.read_text().replace("profiles:\n", "profiles:\n  plain: {server_args: {mem-fraction-static: 0.8}}\n")
    path = tmp_path / "p.yaml"
    path.write_text(text)
    base = load_recipe(path)
    plain = base.with_profile("plain")
    assert plain.mtp == base.mtp and plain.server_args["mem-fraction-static"] == 0.8


def test_an_unknown_profile_names_the_known_ones() -> None:
    known = "profiles: low-latency, balanced, max-throughput"
    with pytest.raises(ConfigError, match=re.escape(f"no serving profile 'fast' ({known})")):
        load_recipe(SHIPPED).with_profile("fast")


def test_a_profile_may_not_set_what_orch_sets(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(SHIPPED.read_text().replace("profiles:\n", "profiles:\n  bad: {server_args: {port: 1}}\n"))
    with pytest.raises(ConfigError, match=r"key 'profiles.bad.server_args': 'port' is --port, which orch sets"):
        load_recipe(path)


@pytest.mark.parametrize("name", ["low lat", "a,b", "x" * 41])
def test_a_profile_name_is_one_word_of_at_most_40_characters(tmp_path: Path, name: str) -> None:
    """A space hid the profile from the report (its sweep labels are split on spaces); 110 characters made a
    sweep label too long after the canary had been relaunched."""
    path = tmp_path / "p.yaml"
    path.write_text(SHIPPED.read_text().replace("profiles:\n", f"profiles:\n  '{name}': {{}}\n"))
    with pytest.raises(ConfigError, match=r"key 'profiles': .*one word of 1 to 40 characters, no comma"):
        load_recipe(path)


def test_serve_with_an_unknown_profile_is_exit_2_before_any_host(tmp_path: Path, orch: Callable[..., OrchRun]) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1}\n")
    result = orch("-i", str(inventory), "serve", "--profile", "fast", "--dry-run")
    assert result.returncode == 2
    assert "no serving profile 'fast'" in result.stderr
    empty = orch("-i", str(inventory), "serve", "--profile", "", "--dry-run")  # it served the base recipe
    assert empty.returncode == 2 and "no serving profile ''" in empty.stderr


def test_serve_mtp_with_a_profile_without_mtp_is_exit_2_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    """``--mtp`` typed with a profile that says ``mtp: null`` was served without MTP, "as asked"."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1}\n")
    result = orch("-i", str(inventory), "serve", "--profile", "max-throughput", "--mtp", "--dry-run")
    assert result.returncode == 2, result.stderr
    assert "--mtp: serving profile 'max-throughput' serves without MTP (mtp: null in " in result.stderr
    assert "drop --mtp" in result.stderr


def test_sweep_then_serve_at_a_concurrency_it_does_not_run_is_exit_2_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: never reached
    args = ["-i", str(inventory), "--state", str(tmp_path / "state.db"), "sweep", "--host", "h1"]
    result = orch(*args, "--concurrency", "1,8", "--then-serve", "BEST@32", "--yes")
    assert result.returncode == 2
    assert "--then-serve: concurrency 32 is not one the sweep runs (1,8): add it to --concurrency" in result.stderr
    assert "sweep: a canary run" not in result.stderr and not (tmp_path / "state.db").exists()


def test_a_benchmark_of_a_prompt_longer_than_any_model_reads_is_exit_2_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    """`bench --input-len 999999999999` ran on the host, whose benchmark died of a MemoryError."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: never reached
    for flag in ("--input-len", "--output-len"):
        result = orch("-i", str(inventory), "--state", str(tmp_path / "state.db"), "bench", flag, "999999999999")
        assert result.returncode == 2, result.stderr
        assert flag in result.stderr and "10000000" in result.stderr.replace(",", ""), result.stderr
        assert not (tmp_path / "state.db").exists()


def test_a_sweep_that_measured_no_profile_on_a_host_is_exit_3_and_then_serves_nothing_there(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: every profile fails
    args = ["-i", str(inventory), "--state", str(tmp_path / "state.db"), "--connect-timeout", "1", "sweep"]
    result = orch(*args, "--host", "h1", "--profiles", "low-latency,balanced", "--concurrency", "1",
                  "--then-serve", "BEST@1", "--yes")  # fmt: skip
    assert result.returncode == 3, result.output
    for profile in ("low-latency", "balanced"):
        assert f"h1: profile {profile} was not measured: cannot connect to 127.0.0.1:1" in result.stderr
    assert "h1: not every profile was measured: --then-serve serves nothing there" in result.stderr
    assert "won at concurrency" not in result.output and "Pareto front" not in result.output


def with_steps(tmp_path: Path, steps: str) -> Path:
    text = SHIPPED.read_text()
    path = tmp_path / "p.yaml"
    path.write_text(text[: text.index("\nsteps:\n")] + "\nsteps:\n" + steps)
    return path


def test_a_playbook_may_run_profile_and_sweep_steps_with_their_commands_options(tmp_path: Path) -> None:
    steps = "  - serve\n  - profile: {steps: 3, label: before}\n  - sweep: {concurrency: [8, 1, 8], then_serve: 8}\n"
    recipe = load_recipe(with_steps(tmp_path, steps))
    assert [s.name for s in recipe.steps] == ["serve", "profile", "sweep"]
    assert recipe.steps[1].options == ProfileOptions(steps=3, label="before")
    assert recipe.steps[2].options == SweepOptions(profiles=None, concurrency=[1, 8], then_serve=8)
    assert load_recipe(with_steps(tmp_path, "  - sweep\n")).steps[0].options == SweepOptions()


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("sweep: {concurrency: [1, 8], then_serve: 32}", "then_serve 32 is not one of the sweep's concurrencies (1, 8"),
        ("sweep: {concurrency: [0]}", "concurrencies are whole numbers from 1 to 100,000"),
        ("sweep: {concurrency: [1, 1000000]}", "concurrencies are whole numbers from 1 to 100,000"),
        ("sweep: {profiles: []}", "profiles"),
        ("profile: {steps: 0}", "steps"),
        ("profile: {stage: decode}", "stage"),
    ],
)
def test_bad_profile_and_sweep_steps_are_refused_at_the_playbook(tmp_path: Path, step: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe(with_steps(tmp_path, f"  - {step}\n"))


def test_run_with_a_sweep_step_of_an_unknown_profile_is_exit_2_before_any_host(
    tmp_path: Path, orch: Callable[..., OrchRun]
) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  h1: {address: 127.0.0.1, port: 1}\n")  # nothing listens: never reached
    playbook = with_steps(tmp_path, "  - sweep: {profiles: [low-latency, fast]}\n")
    result = orch("-i", str(inventory), "--state", str(tmp_path / "state.db"), "run", str(playbook))
    assert result.returncode == 2
    assert "no serving profile 'fast'" in result.stderr and not (tmp_path / "state.db").exists()
