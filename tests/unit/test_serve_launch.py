"""``serve``'s launch check (``ops.serve.check_launch``): what its refusal names as the thing to fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.errors import ExitCode, RefusedError
from orchestrator.facts import server as server_facts
from orchestrator.inventory import Host
from orchestrator.ops import serve as serve_op
from orchestrator.readers import HostServer
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, ServeOptions, load_recipe
from orchestrator.session import HostSession
from orchestrator.store import StateStore

HOST = Host(name="h1", address="127.0.0.1")
ENTRYPOINT = ["python3", "-m", "sglang.launch_server"]
BACKENDS = ("auto", "cutlass", "triton")
RECIPE = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")


class Host1(HostSession):
    """A host whose SGLang knows every flag of the recipe's launch, ``--fp8-gemm-backend`` taking only
    ``BACKENDS``; asked nothing else (a check that ran a command would fail on ``runner=None``)."""

    def __init__(self, store: StateStore, recipe: Recipe) -> None:
        super().__init__(HOST, None, store)  # type: ignore[arg-type]
        argv = server_facts.launch_argv(recipe, HOST, mtp=True, entrypoint=ENTRYPOINT)
        flags: dict[str, tuple[str, ...] | None] = {w: None for w in argv if w.startswith("--")}
        self.surface = HostServer(ENTRYPOINT, {**flags, "--fp8-gemm-backend": BACKENDS})

    def server_surface(self) -> HostServer:
        return self.surface

    def parser_refusal(self, flags: Sequence[str]) -> str | None:
        return None


def test_a_backend_the_host_refuses_from_the_option_names_the_option_not_the_recipe(tmp_path: Path) -> None:
    # `orch serve --fp8-gemm-backend bogus` said "recipe .../deepseek-v4-flash.yaml refused", hint "fix the recipe"
    session = Host1(StateStore(tmp_path / "state.db"), RECIPE)
    with pytest.raises(RefusedError) as refused:
        serve_op.dry_run(session, RECIPE, ServeOptions(fp8_gemm_backend="bogus"))
    assert refused.value.exit_code == ExitCode.HOSTS_FAILED  # only the host knows what its SGLang takes
    assert refused.value.message.splitlines() == [
        "h1: --fp8-gemm-backend bogus refused; the running server was left untouched:",
        "  - --fp8-gemm-backend bogus: the host's SGLang accepts only auto, cutlass, triton (got 'bogus')",
    ]
    assert refused.value.hint == (
        "give --fp8-gemm-backend a value the host's SGLang accepts (or leave it out for the recipe's), then serve again"
    )


def test_a_recipe_flag_the_host_refuses_still_names_the_recipe(tmp_path: Path) -> None:
    recipe = RECIPE.model_copy(update={"fp8_gemm_backend": "tritn"})
    session = Host1(StateStore(tmp_path / "state.db"), recipe)
    with pytest.raises(RefusedError) as refused:
        serve_op.dry_run(session, recipe, ServeOptions())
    assert refused.value.message.splitlines()[0] == (
        f"h1: recipe {recipe.path} refused; the running server was left untouched:"
    )
    assert (refused.value.hint or "").startswith("fix the recipe")
