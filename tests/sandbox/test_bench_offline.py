"""The simulated serving benchmark behaves as the real one offline (issue 23 §3, reference §3).

Real 0.5.23 ``random`` samples the text of a local ShareGPT-format ``--dataset-path`` and, without one, calls
``hf_hub_download``, which fails on a host without internet; ``random-ids`` needs no file; the seed is 42.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.sandbox.fleet import DEMO_DATASET

SIM = Path(__file__).resolve().parents[2] / "orchestrator" / "sandbox" / "sglang_sim" / "python"


def sim_bench(*argv: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from sglang.benchmark import serving; a = serving.build_parser().parse_args(sys.argv[1:]);"
    code += " print(a.seed); print(len(serving.load_requests(a)))"
    env = {"PYTHONPATH": str(SIM), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def test_random_without_a_local_dataset_fails_as_the_real_download_does_offline(tmp_path: Path) -> None:
    run = sim_bench("--dataset-name", "random", "--num-prompts", "4")
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith(
        "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub"
    )


def test_random_samples_the_local_dataset_and_random_ids_needs_none_with_seed_42() -> None:
    run = sim_bench("--dataset-name", "random", "--dataset-path", str(DEMO_DATASET), "--num-prompts", "8")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["42", "8"]
    ids = sim_bench("--dataset-name", "random-ids", "--num-prompts", "5", "--apply-chat-template")
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.split() == ["42", "5"]
