"""orch's flag check (``facts.server.check_flags`` over ``parse_help`` of the host's ``--help``) agrees
with the real SGLang parser on what it accepts and refuses.

The real judge is ``prepare_server_args`` itself (argparse with ``allow_abbrev``: an exact option, an
alias or a unique prefix is accepted; an ambiguous prefix, an unknown flag or a value outside the choices
exits 2). Each case states what the real parser does, so the table shows which rule it covers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.facts import server as facts
from tests.conformance.real import real_parse

ACCEPT, REFUSE = "accepted", "refused"

CASES = [
    # exact names and aliases
    ("exact", ["--tp-size", "8"], ACCEPT),
    ("alias", ["--tensor-parallel-size", "8"], ACCEPT),
    ("alias-that-is-also-a-prefix", ["--model", "m"], ACCEPT),
    ("short-alias", ["--ep", "8"], ACCEPT),
    ("store-true", ["--trust-remote-code"], ACCEPT),
    # unique prefixes: argparse accepts them
    ("unique-prefix-tp", ["--tp", "8"], ACCEPT),
    ("unique-prefix-dp", ["--dp", "2"], ACCEPT),
    ("unique-prefix", ["--mem-fraction", "0.8"], ACCEPT),
    ("unique-prefix-of-a-store-true", ["--enable-forward-pass"], ACCEPT),
    # ambiguous prefixes: exit 2 naming the candidates
    ("ambiguous-cuda-graph-max-bs", ["--cuda-graph-max-bs", "64"], REFUSE),
    ("ambiguous-three-candidates", ["--cuda-graph-max", "64"], REFUSE),
    ("ambiguous-store-true-prefix", ["--trust"], REFUSE),
    # unknown flags
    ("unknown", ["--no-such-flag", "1"], REFUSE),
    ("unknown-no-form-of-a-store-true", ["--no-trust-remote-code"], REFUSE),
    # --no-X forms of boolean-optional fields
    ("no-form", ["--no-enable-tf32-matmul"], ACCEPT),
    ("no-form-unique-prefix", ["--no-enable-tf32"], ACCEPT),
    ("no-form-ambiguous-prefix", ["--no-enable"], REFUSE),
    # --flag=value forms
    ("equals-exact", ["--tp-size=8"], ACCEPT),
    ("equals-unique-prefix", ["--tp=8"], ACCEPT),
    ("equals-ambiguous", ["--cuda-graph-max-bs=64"], REFUSE),
    ("equals-choice", ["--fp8-gemm-backend=triton"], ACCEPT),
    ("equals-bad-choice", ["--fp8-gemm-backend=bogus"], REFUSE),
    # choices
    ("choice", ["--fp8-gemm-backend", "cutlass"], ACCEPT),
    ("bad-choice", ["--fp8-gemm-backend", "bogus"], REFUSE),
    # options SGLang registers with help=SUPPRESS: the parser knows them, `--help` does not show them
    ("hidden-option", ["--forward-pass-metrics-worker-id", "w0"], ACCEPT),
    ("hidden-options-ambiguous-prefix", ["--forward-pass-metrics", "x"], REFUSE),
]

_AMBIGUOUS = re.compile(r"ambiguous option: (\S+) could match (.+)$", re.MULTILINE)


def verdicts(flags: list[str], model_dir: Path, real_help: str) -> tuple[str, str, list[facts.Problem], str]:
    real = real_parse(["--model-path", str(model_dir), *flags])
    problems = facts.check_flags(flags, facts.parse_help(real_help))
    return (ACCEPT if real.accepted else REFUSE), (REFUSE if problems else ACCEPT), problems, real.stderr


@pytest.mark.parametrize(("flags", "expected"), [pytest.param(f, e, id=i) for i, f, e in CASES])
def test_orch_accepts_and_refuses_what_the_real_parser_does(
    flags: list[str], expected: str, model_dir: Path, real_help: str
) -> None:
    real, orch, problems, stderr = verdicts(flags, model_dir, real_help)
    assert real == expected, f"the real parser {real} {flags} (the table says {expected}):\n{stderr[-500:]}"
    assert orch == real, f"the real parser {real} {flags}; orch {orch} it: {[str(p) for p in problems]}"


AMBIGUOUS = [pytest.param(f, id=i) for i, f, e in CASES if e == REFUSE and "ambiguous" in i]


@pytest.mark.parametrize("flags", AMBIGUOUS)
def test_orchs_refusal_of_an_ambiguous_prefix_names_the_real_candidates(
    flags: list[str], model_dir: Path, real_help: str
) -> None:
    _, _, problems, stderr = verdicts(flags, model_dir, real_help)
    match = _AMBIGUOUS.search(stderr)
    assert match, f"the real parser did not call {flags[0]} ambiguous:\n{stderr[-500:]}"
    real_candidates = match[2].strip().split(", ")
    assert len(problems) == 1, [str(p) for p in problems]
    assert problems[0].where == flags[0].partition("=")[0]
    assert "ambiguous" in problems[0].reason
    named = re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", problems[0].reason)
    assert named == real_candidates, problems[0].reason


def test_the_real_help_lists_every_flag_orch_reads_from_it(real_help: str) -> None:
    """``parse_help`` finds the real ``--help``'s flags and choices (561 option strings in 0.5.23, less
    the hidden ones and ``-h``)."""
    known = facts.parse_help(real_help)
    assert "--model-path" in known and "--tensor-parallel-size" in known and "--no-enable-tf32-matmul" in known
    assert known["--fp8-gemm-backend"] == (
        "auto",
        "deep_gemm",
        "flashinfer_trtllm",
        "flashinfer_cutlass",
        "flashinfer_deepgemm",
        "flashinfer_cutedsl",
        "cutlass",
        "triton",
        "aiter",
    )
