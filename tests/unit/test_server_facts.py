"""Pure server facts: launch argv, the MTP rules, the host's --help flags, HTTP answers, /server_info."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import server
from orchestrator.facts.server import HttpAnswer, HttpRequest, Problem, SpecSettings
from orchestrator.inventory import Host
from orchestrator.recipe import PACKAGED_PLAYBOOKS, Recipe, load_recipe

HOST = Host(name="b1", address="127.0.0.2", python="/opt/sg lang/bin/python", model_path="/m/DS V4", server_port=31000)
V4 = "DeepseekV4ForCausalLM"


def recipe(mtp: dict[str, Any] | None = None, arch: str = V4, **extra: Any) -> Recipe:
    base: dict[str, Any] = {"model": "DeepSeek-V4-Flash", "architecture": arch, "server_args": {"tp": 8}}
    if mtp is not None:
        base["mtp"] = mtp
    return Recipe.model_validate({**base, **extra})


GOOD_MTP = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
DSPARK_MTP = {"algorithm": "DSPARK", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 8}

# --- launch argv --------------------------------------------------------------------------------------


def test_launch_argv_with_mtp_has_model_port_args_backend_and_speculative_flags() -> None:
    r = recipe(GOOD_MTP, server_args={"trust-remote-code": True, "tp": 8, "mem-fraction-static": 0.85})
    r = r.model_copy(update={"fp8_gemm_backend": "triton"})
    assert server.launch_argv(r, HOST, mtp=True) == [
        "/opt/sg lang/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/DS V4", "--port", "31000",
        "--trust-remote-code", "--tp", "8", "--mem-fraction-static", "0.85", "--fp8-gemm-backend", "triton",
        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip


def test_launch_argv_without_mtp_has_no_speculative_flag() -> None:
    argv = server.launch_argv(recipe(GOOD_MTP), HOST, mtp=False)
    assert not [a for a in argv if a.startswith("--speculative")]


def test_the_algorithm_is_sent_upper_case_as_deepseek_v4_checks_the_raw_string() -> None:
    argv = server.launch_argv(recipe({**GOOD_MTP, "algorithm": "eagle"}), HOST, mtp=True)
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE"


def test_launch_argv_with_sglang_serve_and_split_back_into_entrypoint_and_server_args() -> None:
    serve, module = server.entrypoints(HOST)
    assert serve == ["/opt/sg lang/bin/sglang", "serve", "--model-type", "llm"]
    assert module == ["/opt/sg lang/bin/python", "-m", "sglang.launch_server"]
    for entry, name in ((serve, "sglang serve"), (module, "python -m sglang.launch_server")):
        argv = server.launch_argv(recipe(GOOD_MTP), HOST, mtp=False, entrypoint=entry)
        assert server.split_entrypoint(argv) == (entry, ["--model-path", "/m/DS V4", "--port", "31000", "--tp", "8"])
        assert server.entrypoint_name(argv) == name
    with pytest.raises(ValueError, match="not an SGLang server command"):
        server.split_entrypoint(["/usr/bin/python", "other.py", "--port", "1"])


@pytest.mark.parametrize(
    ("reported", "cap", "words"),
    [
        ("auto", "12.0", "auto = CUTLASS on sm_120 (tuned Triton configs unused)"),
        (None, "12.0", "not reported = CUTLASS on sm_120 (tuned Triton configs unused)"),
        ("auto", "9.0", "auto"),
        ("triton", "12.0", "triton"),
        ("cutlass", "12.0", "cutlass (tuned Triton configs unused)"),
    ],
)
def test_backend_runs_names_what_auto_really_runs_on_sm120(reported: str | None, cap: str, words: str) -> None:
    assert server.backend_runs(reported, cap) == words


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        ({"tp": 8}, ["--tp", "8"]),
        ({"trust-remote-code": True}, ["--trust-remote-code"]),
        ({"disable-cuda-graph": False}, []),
        ({"mem-fraction-static": 0.85, "attention-backend": "fa3"},
         ["--mem-fraction-static", "0.85", "--attention-backend", "fa3"]),
    ],
)  # fmt: skip
def test_server_arg_flags(args: dict[str, Any], flags: list[str]) -> None:
    assert server.server_arg_flags(args) == flags


@pytest.mark.parametrize(
    ("args", "gpus"),
    [
        ({}, [0]),
        ({"tp": 8}, list(range(8))),
        ({"tp": 2, "dp": 2}, [0, 1, 2, 3]),
        ({"tp": 4, "base-gpu-id": 6}, [6, 7]),
        # attention-DP (SGLang: attn_dp_size 4, dp_size 1) runs inside the tp GPUs, as upstream's V4 recipes do
        ({"tp-size": 4, "dp-size": 4, "enable-dp-attention": True}, [0, 1, 2, 3]),
        ({"tp-size": 2, "dp-size": 2, "attn-dp-size": 2, "enable-dp-attention": True}, [0, 1, 2, 3]),
    ],
)
def test_server_gpus(args: dict[str, Any], gpus: list[int]) -> None:
    assert server.server_gpus(recipe(server_args=args), HOST.model_copy(update={"gpus": 8})) == gpus


@pytest.mark.parametrize(
    ("bound", "url"),
    [(None, "http://127.0.0.1:31000"), ("0.0.0.0", "http://127.0.0.1:31000"), ("10.0.0.5", "http://10.0.0.5:31000")],
)
def test_base_url_reaches_the_bound_address_from_the_host(bound: str | None, url: str) -> None:
    args: dict[str, Any] = {"tp": 8} if bound is None else {"tp": 8, "host": bound}
    assert server.base_url(recipe(server_args=args), HOST) == url


# --- MTP rules ------------------------------------------------------------------------------------------


def where(problems: list[Problem]) -> list[str]:
    return [p.where for p in problems]


@pytest.mark.parametrize(
    ("mtp", "arch", "expected", "reason_part"),
    [
        (GOOD_MTP, V4, [], ""),
        (DSPARK_MTP, V4, [], ""),
        ({"algorithm": "DSPARK", "draft_model_path": "/m/dspark"}, V4, [], ""),
        ({**GOOD_MTP, "algorithm": "DSPARK"}, V4, ["mtp.num_steps"], "SGLang overrides 3 with 1"),
        ({**DSPARK_MTP, "eagle_topk": 2}, V4, ["mtp.eagle_topk"], "DSPARK runs eagle_topk 1"),
        ({**DSPARK_MTP, "num_draft_tokens": 1}, V4, ["mtp.num_draft_tokens"], "gamma + 1 >= 2"),
        ({"algorithm": "FROZEN_KV_MTP"}, "Gemma4ForCausalLM", [], ""),
        ({"algorithm": "EAGLE", "eagle_topk": 1, "num_steps": 3}, V4, ["mtp"], "all or none"),
        ({**GOOD_MTP, "algorithm": "MTP"}, V4, ["mtp.algorithm"], "not an SGLang algorithm name"),
        ({**GOOD_MTP, "algorithm": "NEXTN"}, V4, ["mtp.algorithm"], "pass `EAGLE`, not `NEXTN`"),
        ({**GOOD_MTP, "algorithm": "EAGLE3"}, V4, ["mtp.algorithm"], "only EAGLE or DSPARK"),
        ({**GOOD_MTP, "algorithm": "WARP"}, V4, ["mtp.algorithm"], "unknown speculative algorithm"),
        ({"algorithm": "EAGLE"}, V4, ["mtp.eagle_topk"], "given explicitly (not given)"),
        ({**GOOD_MTP, "eagle_topk": 2, "num_draft_tokens": 8}, V4, ["mtp.eagle_topk"], "eagle_topk 1"),
        ({**GOOD_MTP, "num_draft_tokens": 6}, V4, ["mtp.num_draft_tokens"], "num_steps + 1 = 4"),
        ({**GOOD_MTP, "draft_model_path": "/m/draft"}, V4, [], ""),  # kept by SGLang (with a warning)
        ({**GOOD_MTP, "draft_model_path": "/m/draft"}, "LlamaForCausalLM", [], ""),
        ({"algorithm": "NEXTN"}, "DeepseekV3ForCausalLM", [], ""),
        ({"algorithm": "eagle", "eagle_topk": 1, "num_steps": 2, "num_draft_tokens": 3}, V4, [], ""),
    ],
)
def test_mtp_rules(mtp: dict[str, Any], arch: str, expected: list[str], reason_part: str) -> None:
    problems = server.check_recipe(recipe(mtp, arch=arch), mtp=True)
    assert where(problems) == expected
    assert reason_part in " ".join(p.reason for p in problems)


def test_mtp_rules_report_every_problem() -> None:
    problems = server.check_recipe(recipe({"algorithm": "EAGLE", "num_steps": 3, "draft_model_path": "/d"}), mtp=True)
    assert where(problems) == ["mtp.eagle_topk", "mtp"]


def test_dspark_with_dp_attention_needs_the_dp_lm_head() -> None:
    args = {"tp-size": 4, "dp-size": 4, "enable-dp-attention": True}
    problems = server.check_recipe(recipe(DSPARK_MTP, server_args=args), mtp=True)
    assert [str(p) for p in problems] == ["server_args: DSPARK with DP attention needs `enable-dp-lm-head: true`"]
    assert server.check_recipe(recipe(DSPARK_MTP, server_args={**args, "enable-dp-lm-head": True}), mtp=True) == []


def test_mtp_asked_without_an_mtp_block_is_a_problem_and_no_mtp_checks_nothing() -> None:
    assert where(server.check_recipe(recipe(None), mtp=True)) == ["mtp"]
    assert server.check_recipe(recipe({"algorithm": "MTP"}), mtp=False) == []


def test_shipped_playbook_passes_the_rules() -> None:
    shipped = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")
    assert server.check_recipe(shipped, mtp=True) == []
    assert shipped.fp8_gemm_backend == "triton"
    assert shipped.min_accept_length == 2.8


# --- --help --------------------------------------------------------------------------------------------

HELP = """usage: launch_server.py [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]
                        [--fp8-gemm-backend {auto,cutlass,triton}]

options:
  -h, --help            show this help message and exit
  --model-path MODEL_PATH, --model MODEL_PATH
                        The path of the model weights. Prefer --model-path over --weights-dir.
  --trust-remote-code   Whether or not to allow for custom models.
  --port PORT           The port of the HTTP server.
  --tensor-parallel-size TP_SIZE, --tp-size TP_SIZE, --tp TP_SIZE
                        The tensor parallelism size.
  --fp8-gemm-backend {auto,cutlass,triton}
                        Choose the runner backend.
                        --not-a-flag is mentioned here only.
  --speculative-algorithm SPECULATIVE_ALGORITHM
                        Speculative algorithm.
  --dtype, --data-type {auto,half}
                        Python 3.13 prints the metavar once.
"""


def test_parse_help_reads_the_option_column_with_choices() -> None:
    flags = server.parse_help(HELP)
    assert flags["--fp8-gemm-backend"] == ("auto", "cutlass", "triton")
    assert flags["--dtype"] is None and flags["--data-type"] == ("auto", "half")
    assert {"--model-path", "--model", "--tp", "--tp-size", "--trust-remote-code", "--help"} <= set(flags)
    assert "--not-a-flag" not in flags and "--weights-dir" not in flags


STAND_IN_PARSER = (
    "import argparse\n"
    "class ServerArgs:\n"
    "    @staticmethod\n"
    "    def add_cli_args(p):\n"
    "        p.add_argument('--model-path', '--model')\n"
    "        p.add_argument('--fp8-gemm-backend', choices=['auto', 'triton'])\n"
    "        p.add_argument('--tp-size', type=int)\n"
    "        p.add_argument('--tp-hidden', help=argparse.SUPPRESS)\n"
)


def run_against_a_stand_in(tmp_path: Path, argv: list[str]) -> str:
    """``argv``'s stdout run with a stand-in `sglang.srt.server_args` first on the path (the real one:
    tests/conformance)."""
    package = tmp_path / "sglang" / "srt"
    package.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "server_args.py").write_text(STAND_IN_PARSER)
    done = subprocess.run(argv, capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)}, check=True)
    return done.stdout


def test_parser_snippet_lists_hidden_options_that_help_does_not(tmp_path: Path) -> None:
    stdout = run_against_a_stand_in(tmp_path, server.parser_argv(sys.executable))
    known = server.parse_parser(stdout)
    assert known is not None
    assert known["--fp8-gemm-backend"] == ("auto", "triton") and known["--model"] is None
    assert "--tp-hidden" in known  # argparse counts it: `--tp` is ambiguous there, though --help shows one
    assert [p.reason.split(":")[0] for p in server.check_flags(["--tp", "8"], known)] == ["ambiguous"]
    assert server.parse_parser("Traceback ...\nImportError: x") is None
    assert server.parse_parser('{"--port": null}') is None  # not a server parser


def test_parse_check_reports_a_value_the_parser_cannot_convert(tmp_path: Path) -> None:
    def verdict(*flags: str) -> str | None:
        argv = server.parse_check_argv(sys.executable, ["--model-path", "/m", *flags])
        return server.parse_refusal(run_against_a_stand_in(tmp_path, argv))

    assert verdict("--tp-size", "8") is None
    assert verdict("--tp-size", "eight") == "argument --tp-size: invalid int value: 'eight'"
    assert verdict("--tp-size", "8; rm -rf /") == "argument --tp-size: invalid int value: '8; rm -rf /'"  # literal
    assert server.parse_refusal("Traceback ...\nImportError: x") is None  # cannot tell: the launch tells
    assert server.parse_refusal('{"refused": null}') is None


def test_canonical_flag_reads_a_unique_prefix_as_argparse_does() -> None:
    known = ["--tp-size", "--tensor-parallel-size", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    assert server.canonical_flag("tp", known) == "tp-size"
    assert server.canonical_flag("tp-size", known) == "tp-size"
    assert server.canonical_flag("cuda-graph-max-bs", known) == "cuda-graph-max-bs"  # ambiguous: left as written
    assert server.canonical_flag("bogus", known) == "bogus"


def test_check_flags_finds_unknown_flags_and_bad_choices() -> None:
    known = server.parse_help(HELP)
    argv = ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8", "--fp8-gemm-backend", "tritn"]
    argv += ["--trust-remote-code", "--speculative-algorithmm", "EAGLE", "--port=30000"]
    problems = server.check_flags(argv, known)
    assert where(problems) == ["--fp8-gemm-backend", "--speculative-algorithmm"]
    assert "accepts only auto, cutlass, triton (got 'tritn')" in problems[0].reason
    assert "did upstream rename it to --speculative-algorithm?" in problems[1].reason


@pytest.mark.parametrize(
    ("arg", "outcome"),
    [
        ("--tensor-parallel-size", "ok"),  # exact
        ("--tp-size", "ok"),  # alias
        ("--speculative-algo", "ok"),  # unique prefix: argparse accepts it
        ("--fp8-gemm=triton", "ok"),  # unique prefix with an inline value
        ("--fp8-gemm=tritn", "the host's SGLang accepts only auto, cutlass, triton (got 'tritn')"),
        ("--mod", "ambiguous: SGLang refuses an abbreviation that could match --model-path, --model (exit 2)"),
        ("--bogus", "the host's SGLang does not know this flag (not in its server's `--help`)"),
    ],
)
def test_check_flags_follows_argparse_rules(arg: str, outcome: str) -> None:
    problems = server.check_flags([arg, "x"], server.parse_help(HELP))
    assert ([] if outcome == "ok" else [outcome]) == [p.reason.split("; ")[0] for p in problems]


def test_an_unknown_flag_gets_no_hint_to_an_unrelated_one() -> None:
    (problem,) = server.check_flags(["--ep", "8"], server.parse_help(HELP))  # --tp is 0.75 alike
    assert "did upstream rename" not in problem.reason


def test_check_flags_accepts_the_shipped_recipe_against_known_flags() -> None:
    argv = ["py", "-m", "x", "--model-path", "/m", "--tp", "8", "--fp8-gemm-backend", "triton", "--trust-remote-code"]
    assert server.check_flags(argv, server.parse_help(HELP)) == []


# --- HTTP ------------------------------------------------------------------------------------------------


def test_http_argv_passes_requests_as_one_json_argument() -> None:
    argv = server.http_argv("/py", [HttpRequest("GET", "http://127.0.0.1:1/health", timeout=2)])
    assert argv[:2] == ["/py", "-c"] and json.loads(argv[3]) == [["GET", "http://127.0.0.1:1/health", None, 2]]


def test_http_snippet_runs_and_reports_no_answer_as_status_0(tmp_path: Path) -> None:
    import subprocess
    import sys

    argv = server.http_argv(sys.executable, [HttpRequest("GET", "http://127.0.0.1:9/health", timeout=1)])
    out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, check=True).stdout
    (answer,) = server.parse_http(out)
    assert answer.status == 0 and "Error" in answer.body


def test_parse_http_and_bad_output() -> None:
    assert server.parse_http('[{"status": 200, "body": "{}"}]\n') == [HttpAnswer(200, "{}")]
    with pytest.raises(ValueError, match="unexpected output"):
        server.parse_http("Traceback ...\n")


def test_generate_request_is_a_short_deterministic_post() -> None:
    req = server.generate_request("http://h:1", 64, 2)
    assert (req.method, req.url) == ("POST", "http://h:1/generate")
    assert req.body["sampling_params"] == {"max_new_tokens": 64, "temperature": 0}


# --- /server_info ------------------------------------------------------------------------------------------

INFO_MTP = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "fp8_gemm_runner_backend": "triton",
    "internal_states": [{"#running-req": 0, "avg_spec_accept_length": 3.1}],
}


def test_spec_settings_of_server_info() -> None:
    assert server.spec_settings(INFO_MTP) == SpecSettings("EAGLE", 3, 1, 4)
    assert server.spec_settings({"speculative_algorithm": None}) == SpecSettings(None)
    assert str(SpecSettings("EAGLE", 3, 1, 4)) == "EAGLE steps=3 topk=1 draft=4"


@pytest.mark.parametrize(
    ("mtp", "expected"),
    [
        (GOOD_MTP, SpecSettings("EAGLE", 3, 1, 4)),
        ({"algorithm": "NEXTN"}, SpecSettings("EAGLE", 3, 1, 4)),  # DeepSeek default (3, 1, 4)
        (
            {"algorithm": "eagle", "num_steps": 2, "eagle_topk": 1, "num_draft_tokens": 9},
            SpecSettings("EAGLE", 2, 1, 3),
        ),
        (DSPARK_MTP, SpecSettings("DSPARK", 1, 1, 8)),
        ({"algorithm": "dspark", "num_steps": 3}, SpecSettings("DSPARK", 1, 1, None)),  # the draft decides gamma
    ],
)
def test_expected_spec(mtp: dict[str, Any], expected: SpecSettings) -> None:
    assert server.expected_spec(recipe(mtp), mtp=True) == expected
    assert server.expected_spec(recipe(mtp), mtp=False) == SpecSettings(None)


@pytest.mark.parametrize(
    ("actual", "expected", "problems"),
    [
        (SpecSettings("EAGLE", 3, 1, 4), SpecSettings("EAGLE", 3, 1, 4), []),
        (SpecSettings(None), SpecSettings("EAGLE", 3, 1, 4), ["speculative_algorithm"]),
        (SpecSettings("EAGLE", 2, 1, 3), SpecSettings("EAGLE", 3, 1, 4),
         ["speculative_num_steps", "speculative_num_draft_tokens"]),
        (SpecSettings("EAGLE", 3, 1, 4), SpecSettings(None), ["speculative_algorithm"]),
        (SpecSettings(None), SpecSettings(None), []),
        (SpecSettings("EAGLE", 5, 1, 6), SpecSettings("EAGLE", None, None, None), []),
    ],
)  # fmt: skip
def test_check_spec(actual: SpecSettings, expected: SpecSettings, problems: list[str]) -> None:
    assert where(server.check_spec(actual, expected)) == problems


def test_check_backend_reads_the_real_key_fp8_gemm_runner_backend() -> None:
    assert server.check_backend(INFO_MTP, "triton") == []
    assert where(server.check_backend({"fp8_gemm_runner_backend": "auto"}, "triton")) == ["fp8_gemm_runner_backend"]
    assert server.check_backend({"fp8_gemm_runner_backend": "auto"}, None) == []


def test_check_backend_falls_back_to_the_old_key_and_fails_when_none_is_reported() -> None:
    assert server.check_backend({"fp8_gemm_backend": "triton"}, "triton") == []
    (problem,) = server.check_backend({"tp_size": 8}, "triton")
    assert str(problem) == "fp8_gemm_runner_backend: the server reports no FP8 GEMM backend, expected 'triton'"


@pytest.mark.parametrize(
    ("info", "value"),
    [
        (INFO_MTP, 3.1),
        ({"internal_states": [{"#running-req": 0}]}, None),  # before the first decode log interval
        ({"internal_states": []}, None),
        ({}, None),
    ],
)
def test_avg_accept_length(info: dict[str, Any], value: float | None) -> None:
    assert server.avg_accept_length(info) == value


def test_generate_accept_length() -> None:
    body = json.dumps({"text": "x", "meta_info": {"spec_accept_length": 3.05, "spec_verify_ct": 40}})
    assert server.generate_accept_length(HttpAnswer(200, body)) == 3.05
    assert server.generate_accept_length(HttpAnswer(200, json.dumps({"meta_info": {}}))) is None
    assert server.generate_accept_length(HttpAnswer(503, body)) is None


def test_shipped_playbook_shapes_are_the_simulated_models_verified_gemm_shapes_at_tp8() -> None:
    """The four `tuning.shapes` are what the simulated server (from the sandbox's config.json) runs, but
    the two reference §1.3 calls unverified (indexer wq_b; MTP e_proj/h_proj): `--shapes logged` finds
    those from a triton server's log."""
    import importlib.util

    from orchestrator.sandbox.modelconfig import DEEPSEEK_V4_FLASH

    sim = Path(PACKAGED_PLAYBOOKS).parent / "orchestrator/sandbox/sglang_sim/python/sglang/_sim/model.py"
    spec = importlib.util.spec_from_file_location("sim_model", sim)
    assert spec is not None and spec.loader is not None
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    shipped = load_recipe(PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml")
    runs = {(n, k) for _, n, k in model.deepseek_v4_shapes(DEEPSEEK_V4_FLASH, 8)}
    with_mtp = {(n, k) for _, n, k in model.deepseek_v4_shapes(DEEPSEEK_V4_FLASH, 8, mtp=True)}
    assert {(s.n, s.k) for s in shipped.tuning.shapes} == runs - {(8192, 1024)}
    assert with_mtp - runs == {(4096, 4096)}
    assert len(shipped.tuning.shapes) == 4 and all(s.source for s in shipped.tuning.shapes)
    assert {(1536, 4096), (4096, 1024)} <= runs
    assert server.recipe_tp_size(shipped, 1) == 8  # the shapes are TP 8's


@pytest.mark.parametrize(
    ("argv", "address"),
    [
        (["python", "-m", "sglang.launch_server", "--port", "30000"], "127.0.0.1"),
        (["python", "-m", "sglang.launch_server", "--host", "0.0.0.0", "--port", "30000"], "127.0.0.1"),
        (["python", "-m", "sglang.launch_server", "--host", "10.1.230.171"], "10.1.230.171"),
        (["python", "-m", "sglang.launch_server", "--host", "::"], "127.0.0.1"),
    ],
)
def test_a_launched_server_is_reached_where_its_command_line_binds_it(argv: list[str], address: str) -> None:
    assert server.argv_address(argv) == address
    assert server.url(address, 30000) == f"http://{address}:30000"


# --- what SGLang resolves at launch ------------------------------------------------------------------------


def test_deepseek_v4_on_sm120_resolves_dsv4_pages_256_requests_and_the_mxfp4_moe_runner() -> None:
    assert server.asked_settings(recipe(GOOD_MTP)) == dict.fromkeys(server.RESOLVED_SETTINGS, "auto")
    assert server.expected_settings(recipe(GOOD_MTP), "12.0") == {
        "moe_runner_backend": "flashinfer_mxfp4",
        "attention_backend": "dsv4",
        "page_size": "256",
        "max_running_requests": "256",
    }


def test_what_the_recipe_names_wins_and_an_a2a_backend_leaves_the_moe_runner_to_sglang() -> None:
    args = {"tp-size": 8, "max-running-requests": 64, "moe-a2a-backend": "deepep"}
    expected = server.expected_settings(recipe(GOOD_MTP, server_args=args), "12.0")
    assert (expected["max_running_requests"], expected["moe_runner_backend"]) == ("64", "auto")
    assert server.expected_settings(recipe(GOOD_MTP, arch="LlamaForCausalLM"), "12.0")["page_size"] == "auto"


def test_check_settings_reports_a_resolved_setting_other_than_expected() -> None:
    expected = server.expected_settings(recipe(GOOD_MTP), "12.0")
    resolved = {"moe_runner_backend": "triton", "attention_backend": "dsv4"}
    assert [str(p) for p in server.check_settings(resolved, expected)] == [
        "moe_runner_backend: the server resolved triton, expected flashinfer_mxfp4"
    ]


@pytest.mark.parametrize(
    ("args", "gpus"),
    [
        ({"tp": 8}, list(range(8))),
        ({"tp": 16}, list(range(16))),  # not capped: the replacement check compares them with nvidia-smi's
        ({"tp": 4, "dp": 4}, list(range(16))),
        ({"tp": 4, "dp": 4, "enable-dp-attention": True}, [0, 1, 2, 3]),  # attention-DP inside the tp GPUs
        ({"tp": 4, "base-gpu-id": 6}, [6, 7, 8, 9]),
    ],
)
def test_needed_gpus(args: dict[str, Any], gpus: list[int]) -> None:
    assert server.needed_gpus(recipe(server_args=args)) == gpus
