"""orch's flag check (``facts.server.check_flags``) agrees with the real SGLang parser on what it accepts
and refuses.

The real judge is ``prepare_server_args`` itself (argparse with ``allow_abbrev``: an exact option, an
alias or a unique prefix is accepted; an ambiguous prefix, an unknown flag or a value outside the choices
exits 2). Each case states what the real parser does, so the table shows which rule it covers.

orch knows the host's flags from two sources (``conftest.flag_sources``): its parser probe
(``facts.parser_argv``, every option string; what serve uses) must agree on every case; the ``--help``
fallback (``facts.parse_help``) on every case but options registered with ``help=SUPPRESS``, which
``--help`` cannot show: there the fallback refuses, the safe side.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import server as facts
from tests.conformance.real import real_parse, real_parser

ACCEPT, REFUSE = "accepted", "refused"
HIDDEN = "hidden-"

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
    (HIDDEN + "option", ["--forward-pass-metrics-worker-id", "w0"], ACCEPT),
    (HIDDEN + "options-ambiguous-prefix", ["--forward-pass-metrics", "x"], REFUSE),
]
SOURCES = ("parser", "help")

_AMBIGUOUS = re.compile(r"ambiguous option: (\S+) could match (.+)$", re.MULTILINE)


def verdicts(
    flags: list[str], model_dir: Path, known: dict[str, tuple[str, ...] | None]
) -> tuple[str, str, list[facts.Problem], str]:
    real = real_parse(["--model-path", str(model_dir), *flags])
    problems = facts.check_flags(flags, known)
    return (ACCEPT if real.accepted else REFUSE), (REFUSE if problems else ACCEPT), problems, real.stderr


def table(source: str, only_ambiguous: bool = False) -> list[object]:
    """The cases orch's ``source`` must agree on (the ``help`` fallback cannot see hidden options)."""
    return [
        pytest.param(source, flags, expected, id=f"{source}-{name}")
        for name, flags, expected in CASES
        if not (source == "help" and name.startswith(HIDDEN)) and (not only_ambiguous or "ambiguous" in name)
    ]


@pytest.mark.parametrize(("source", "flags", "expected"), [c for s in SOURCES for c in table(s)])
def test_orch_accepts_and_refuses_what_the_real_parser_does(
    source: str, flags: list[str], expected: str, model_dir: Path, flag_sources: dict[str, dict[str, Any]]
) -> None:
    real, orch, problems, stderr = verdicts(flags, model_dir, flag_sources[source])
    assert real == expected, f"the real parser {real} {flags} (the table says {expected}):\n{stderr[-500:]}"
    assert orch == real, f"the real parser {real} {flags}; orch {orch} it: {[str(p) for p in problems]}"


@pytest.mark.parametrize(("source", "flags", "expected"), [c for s in SOURCES for c in table(s, True)])
def test_orchs_refusal_of_an_ambiguous_prefix_names_the_real_candidates(
    source: str, flags: list[str], expected: str, model_dir: Path, flag_sources: dict[str, dict[str, Any]]
) -> None:
    _, _, problems, stderr = verdicts(flags, model_dir, flag_sources[source])
    match = _AMBIGUOUS.search(stderr)
    assert match, f"the real parser did not call {flags[0]} ambiguous:\n{stderr[-500:]}"
    real_candidates = match[2].strip().split(", ")
    assert len(problems) == 1, [str(p) for p in problems]
    assert problems[0].where == flags[0].partition("=")[0]
    assert "ambiguous" in problems[0].reason, problems[0].reason
    named = re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", problems[0].reason)
    assert named == real_candidates, problems[0].reason


@pytest.mark.parametrize("flags", [pytest.param(f, id=n) for n, f, _ in CASES if n.startswith(HIDDEN)])
def test_the_help_fallback_refuses_a_hidden_option_it_cannot_see(
    flags: list[str], flag_sources: dict[str, dict[str, Any]]
) -> None:
    problems = facts.check_flags(flags, flag_sources["help"])
    assert [p.where for p in problems] == [flags[0]]
    assert "--help" in problems[0].reason


def test_orchs_parser_probe_reads_every_option_string_of_the_real_parser(
    flag_sources: dict[str, dict[str, Any]],
) -> None:
    real = {o: a.choices for a in real_parser()._actions for o in a.option_strings}
    probed = flag_sources["parser"]
    assert sorted(probed) == sorted(real)
    assert len(probed) == 561  # reference §2.1
    assert {o: None if c is None else set(c) for o, c in probed.items()} == {
        o: None if c is None else {str(x) for x in c} for o, c in real.items()
    }


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


VALUE_CASES = [
    ("float", ["--mem-fraction-static", "0.8"], ACCEPT),
    ("bad-float", ["--mem-fraction-static", "lots"], REFUSE),
    ("bad-int", ["--tp-size", "eight"], REFUSE),
    ("bad-int-equals", ["--cuda-graph-max-bs-decode=many"], REFUSE),
]


def orch_parse_check(flags: list[str]) -> str | None:
    """What orch's parse check (``facts.parse_check_argv``, the code it runs on the host) answers for
    ``flags``, run here against the real package in this process (importing it per case takes seconds)."""
    argv = facts.parse_check_argv(sys.executable, flags)
    assert argv[1] == "-c"
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ["-c", *argv[3:]]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(argv[2], "<orch parse check>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = saved
    return facts.parse_refusal(out.getvalue())


@pytest.mark.parametrize(
    ("flags", "expected"), [pytest.param(f, e, id=n) for n, f, e in CASES + VALUE_CASES if not n.startswith(HIDDEN)]
)
def test_orchs_parse_check_refuses_what_the_real_parser_does_values_included(
    flags: list[str], expected: str, model_dir: Path
) -> None:
    command = ["--model-path", str(model_dir), *flags]
    real = real_parse(command)
    assert (ACCEPT if real.accepted else REFUSE) == expected, real.stderr[-500:]
    refused = orch_parse_check(command)
    assert (REFUSE if refused else ACCEPT) == expected, refused
    if refused:
        assert refused in real.stderr  # argparse's own words, as the launch would print them


def test_orchs_parse_check_runs_as_a_command_against_the_real_package(model_dir: Path) -> None:
    argv = facts.parse_check_argv(sys.executable, ["--model-path", str(model_dir), "--mem-fraction-static", "lots"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert facts.parse_refusal(proc.stdout) == "argument --mem-fraction-static: invalid float value: 'lots'"
