"""What `orch run` says of a step done, built from the step's result (pure): the integration tests
(tests/integration/test_run.py) see the same lines from a run on the demo fleet."""

from __future__ import annotations

import pytest

from orchestrator.ops import run as run_op
from orchestrator.ops.serve import ServeResult


@pytest.mark.parametrize(
    ("accept", "simulated", "said"),
    [
        (3.1, True, "serving job server-1, speculative EAGLE, accept length 3.10 [simulated]"),
        (3.1, False, "serving job server-1, speculative EAGLE, accept length 3.10"),
        (None, True, "serving job server-1, speculative EAGLE"),  # no number to label
    ],
)
def test_the_serve_steps_accept_length_from_the_simulated_sglang_is_labelled(
    accept: float | None, simulated: bool, said: str
) -> None:
    result = ServeResult(argv=["python"], job_id="server-1", mtp=True, healthy_after=3.0, spec="EAGLE",
                         accept_length=accept, simulated=simulated)  # fmt: skip
    assert run_op._served(result) == said
