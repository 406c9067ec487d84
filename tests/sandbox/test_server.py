"""The simulated SGLang server and serving benchmark: flags, rules, log lines, HTTP answers, shutdown."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sandbox import SimFleet, SimHost, hostdisk
from tests.sandbox.conftest import http_get, http_post, on_host, pid_alive, ssh, start_on_host, wait_until

MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "4"]  # fmt: skip
DEVICE = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
CONFIGS = "python/sglang/kernels/ops/gemm/configs"


def config_name(n: int, k: int) -> str:
    return f"N={n},K={k},device_name={DEVICE},dtype=fp8_w8a8,block_shape=[128, 128].json"


@pytest.fixture
def host(fleet: SimFleet) -> Iterator[SimHost]:
    chosen = fleet.hosts[1]
    chosen.set_knobs(startup_seconds=0.6)
    yield chosen
    chosen.set_knobs(startup_seconds=None, server_fail=None, drain_seconds=None, drain_log_seconds=None)


def server_argv(host: SimHost, *extra: str) -> list[str]:
    base = [str(host.python), "-m", "sglang.launch_server", "--model-path", str(host.model_path), "--tp", "8"]
    return [*base, "--port", str(host.server_port), "--trust-remote-code", *extra]


def url(host: SimHost, path: str) -> str:
    return f"http://127.0.0.1:{host.server_port}{path}"


def health(host: SimHost) -> int | None:
    try:
        return http_get(url(host, "/health"))[0]
    except OSError:
        return None


def bench(fleet: SimFleet, host: SimHost, output: Path, module: str = "sglang.benchmark.serving"):  # type: ignore[no-untyped-def]
    return ssh(
        fleet,
        host,
        f"{host.python} -m {module} --backend sglang --host 127.0.0.1 --port {host.server_port} "
        f"--dataset-name random --dataset-path {host.workdir}/datasets/sharegpt.json "  # staged by the fleet
        f"--random-input-len 32 --random-output-len 48 --num-prompts 8 "
        f"--max-concurrency 4 --output-file {output} --disable-tqdm",
    )


def stop(server: subprocess.Popen[bytes]) -> int:
    server.send_signal(signal.SIGTERM)
    return server.wait(timeout=15)


def test_mtp_server_lifecycle_with_tuned_config_and_bench(fleet: SimFleet, host: SimHost, tmp_path: Path) -> None:
    tuned = host.sglang_dir / CONFIGS / config_name(1536, 4096)
    tuned.write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}}, indent=4) + "\n")
    host.set_knobs(drain_seconds=0.5, drain_log_seconds=0.2)
    log = tmp_path / "server.log"
    server = start_on_host(
        host, server_argv(host, *MTP, "--fp8-gemm-backend", "triton", "--decode-log-interval", "10"), log
    )
    try:
        wait_until(lambda: health(host) is not None, what="the HTTP port")
        assert health(host) == 503  # starting
        wait_until(lambda: health(host) == 200, what="the server to be healthy")
        text = log.read_text()
        assert "TP0] The server is fired up and ready to roll!" in text
        assert f"Using configuration from {tuned} for W8A8 Block FP8 kernel." in text
        default = "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal!"
        missing = [(4096, 1024), (512, 4096), (4096, 256), (8192, 1024), (4096, 4096)]  # MTP adds (4096, 4096)
        lines = [line.split("TP0] ", 1)[1] for line in text.splitlines() if "Config file not found" in line]
        assert lines == [f"{default} Config file not found at {host.sglang_dir / CONFIGS / config_name(n, k)}"
                         for n, k in missing]  # fmt: skip

        _, info = http_get(url(host, "/server_info"))
        assert info is not None
        assert (info["speculative_algorithm"], info["speculative_num_steps"], info["speculative_eagle_topk"],
                info["speculative_num_draft_tokens"]) == ("EAGLE", 3, 1, 4)  # fmt: skip
        assert (info["tp_size"], info["fp8_gemm_runner_backend"], info["max_running_requests"]) == (8, "triton", 256)
        assert info["speculative_draft_model_path"] == str(host.model_path)
        assert "avg_spec_accept_length" not in info["internal_states"][0]  # type: ignore[index]

        out = http_post(url(host, "/generate"), {"text": "hello there", "sampling_params": {"max_new_tokens": 64}})
        meta = out["meta_info"]
        assert meta["completion_tokens"] == 64 and meta["prompt_tokens"] == 2  # type: ignore[index]
        assert meta["spec_accept_length"] > 2.8 and meta["spec_verify_ct"] == 21  # type: ignore[index]
        _, info = http_get(url(host, "/get_server_info"))
        assert info["internal_states"][0]["avg_spec_accept_length"] == 3.1  # type: ignore[index]
        assert "accept len: 3.10, accept rate: 0.78, cuda graph: True, gen throughput (token/s): " in log.read_text()

        procs = host.gpu_processes()
        assert sorted(int(str(p["gpu_index"])) for p in procs) == list(range(8))
        assert {p["pid"] for p in procs} == {server.pid} and {p["used_memory"] for p in procs} == {88098}

        results = tmp_path / "bench.jsonl"
        run = bench(fleet, host, results)
        assert run.returncode == 0, run.stderr
        assert "Output token throughput (tok/s):" in run.stdout and "Accept length:" in run.stdout
        (line,) = results.read_text().splitlines()
        row = json.loads(line)
        assert row["completed"] == 8 and row["accept_length"] == 3.1 and row["output_throughput"] > 0
        for key in ("total_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
                    "mean_itl_ms", "duration"):  # fmt: skip
            assert isinstance(row[key], float)

        server.send_signal(signal.SIGTERM)
        wait_until(lambda: "Draining requests and shutting down..." in log.read_text(), what="the SIGTERM line")
        assert health(host) == 503
        assert server.wait(timeout=15) == 0
    finally:
        tuned.unlink()
        if server.poll() is None:
            server.kill()
            server.wait()
    text = log.read_text()
    assert "SIGTERM received. signum=15 frame=<frame at " in text
    assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in text
    assert host.gpu_processes() == []


def test_plain_server_with_default_backend_reads_no_tuned_config(
    fleet: SimFleet, host: SimHost, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    server = start_on_host(host, server_argv(host), log)
    try:
        wait_until(lambda: health(host) == 200, what="the server to be healthy")
        _, info = http_get(url(host, "/server_info"))
        assert info is not None and info["speculative_algorithm"] is None and info["fp8_gemm_runner_backend"] == "auto"
        assert http_get(url(host, "/ready"))[0] == 200
        assert http_get(url(host, "/v1/models"))[1]["data"][0]["id"] == str(host.model_path)  # type: ignore[index]
        assert http_get(url(host, "/model_info"))[1]["architectures"] == ["DeepseekV4ForCausalLM"]  # type: ignore[index]
        meta = http_post(url(host, "/generate"), {"text": "x", "sampling_params": {"max_new_tokens": 5}})["meta_info"]
        assert meta["completion_tokens"] == 5 and "spec_accept_length" not in meta  # type: ignore[operator,index]
        results = tmp_path / "bench.jsonl"
        run = bench(fleet, host, results, module="sglang.bench_serving")
        assert run.returncode == 0, run.stderr
        assert "deprecated" in run.stderr and "Accept length:" not in run.stdout
        assert json.loads(results.read_text())["accept_length"] is None
    finally:
        assert stop(server) == 0
    assert "W8A8 Block FP8" not in log.read_text()  # CUTLASS on sm_120: the tuned Triton files are never read


@pytest.mark.parametrize(
    "flags",
    [
        ["--speculative-algorithm", "eagle", *MTP[2:]],  # the model hook sees the raw string
        ["--speculative-algorithm", "NEXTN", *MTP[2:]],  # mapped to EAGLE only after the model hook
        ["--speculative-algorithm", "MTP", *MTP[2:]],
        ["--speculative-algorithm", "EAGLE"],  # topk missing: None is not 1
        ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "2"],
    ],
)
def test_deepseek_v4_model_hook_asserts_on_the_raw_algorithm_and_topk_at_launch(
    host: SimHost, flags: list[str]
) -> None:
    run = on_host(host, server_argv(host, *flags))
    assert run.returncode == 1
    assert "Traceback (most recent call last):" in run.stderr and run.stderr.splitlines()[-1] == "AssertionError"
    assert "in _handle_model_specific_adjustments" in run.stderr
    assert "ready to roll" not in run.stderr + run.stdout and host.gpu_processes() == []


def llama(tmp_path: Path) -> Path:
    """A model of another architecture (the DeepSeek-V4 hook does not apply to it)."""
    model = tmp_path / "Llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return model


RESOLVED = (
    "import sys; from sglang.srt.server_args import prepare_server_args as p; a = p(sys.argv[1:]).resolve_once(); "
    "print(a.speculative_algorithm, a.speculative_num_draft_tokens, a.max_running_requests, "
    "a.speculative_draft_model_path == a.model_path)"
)


def resolved(host: SimHost, model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return on_host(host, [str(host.python), "-c", RESOLVED, "--model-path", str(model), *flags])


def test_unknown_algorithm_name_is_a_value_error_after_upper_casing(host: SimHost, tmp_path: Path) -> None:
    run = resolved(host, llama(tmp_path), "--speculative-algorithm", "mtp", *MTP[2:])
    assert run.returncode == 1 and run.stderr.splitlines()[-1] == "ValueError: Unknown speculative algorithm name: MTP"


def test_other_archs_get_the_speculative_hook_only(host: SimHost, tmp_path: Path) -> None:
    model = llama(tmp_path)
    lower = resolved(host, model, "--speculative-algorithm", "eagle", *MTP[2:])
    assert lower.stdout.split() == ["EAGLE", "4", "48", "False"]  # upper-cased; EAGLE's 48; no DeepSeek draft
    assert "Max running requests is reset to 48 for speculative decoding." in lower.stderr
    nextn = resolved(host, model, "--speculative-algorithm", "NEXTN", "--max-running-requests", "8")
    assert nextn.stdout.split() == ["EAGLE", "4", "8", "False"]


def test_parser_keeps_the_raw_values_as_typed(host: SimHost) -> None:
    parsed = "import sys; from sglang.srt.server_args import prepare_server_args as p; a = p(sys.argv[1:]); "
    probe = parsed + "print(a.speculative_algorithm, a.max_running_requests, a.speculative_draft_model_path)"
    raw = on_host(host, [str(host.python), "-c", probe, "--model-path", str(host.model_path),
                         "--speculative-algorithm", "eagle"])  # fmt: skip
    assert raw.returncode == 0 and raw.stdout.split() == ["eagle", "None", "None"]


def test_deepseek_v4_resolution_sets_256_and_draft_tokens_and_draft_model(host: SimHost) -> None:
    steps_only = resolved(host, host.model_path, *MTP[:6], "--speculative-num-steps", "4")
    assert steps_only.stdout.split() == ["EAGLE", "5", "256", "True"]  # draft tokens missing: steps + 1
    assert (
        "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
    ) in steps_only.stderr
    assert "Max running requests is reset to 48" not in steps_only.stderr
    other = resolved(host, host.model_path, *MTP[:6], "--speculative-num-draft-tokens", "2",
                     "--speculative-draft-model-path", "/elsewhere")  # fmt: skip
    assert other.stdout.split() == ["EAGLE", "4", "256", "False"]  # the explicit draft is kept, with a warning
    assert "DeepSeek MTP does not require setting speculative_draft_model_path." in other.stderr
    dspark = resolved(host, host.model_path, "--speculative-algorithm", "DSPARK", "--max-running-requests", "16")
    assert dspark.stdout.split() == ["DSPARK", "8", "16", "False"]  # gamma 7 + 1; the draft: the model's dspark/
    assert "DSpark gamma is not set; defaulting to 7." in dspark.stderr


def test_launch_server_rejects_an_unknown_flag(host: SimHost) -> None:
    run = on_host(host, server_argv(host, "--bogus-flag", "1"))
    assert run.returncode == 2
    assert "sglang serve: error: unrecognized arguments: --bogus-flag 1" in run.stderr


def test_launch_server_parses_with_argparse_prefix_rules_like_the_real_one(host: SimHost) -> None:
    ambiguous = on_host(host, server_argv(host, "--cuda-graph-max-bs", "64"))
    assert ambiguous.returncode == 2
    assert (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    ) in ambiguous.stderr
    probe = "import sys; from sglang.srt.server_args import prepare_server_args as p; print(p(sys.argv[1:]).tp_size)"
    prefix = on_host(host, [str(host.python), "-c", probe, "--model-path", str(host.model_path), "--tp", "4"])
    assert prefix.stdout.split() == ["4"]  # --tp: a unique prefix of --tp-size


def test_help_hides_suppressed_options_and_a_bare_optional_value_takes_its_const(host: SimHost) -> None:
    text = on_host(host, [str(host.python), "-m", "sglang.launch_server", "--help"]).stdout
    assert "--forward-pass-metrics-worker-id" not in text and "--model-checksum" in text  # help=SUPPRESS hides
    probe = (
        "import sys; from sglang.srt.server_args import prepare_server_args as p; "
        "print(repr(p(sys.argv[1:]).model_checksum))"
    )
    bare = on_host(host, [str(host.python), "-c", probe, "--model-path", str(host.model_path), "--model-checksum"])
    assert bare.stdout.split() == ["''"]


def test_launch_server_warns_that_sglang_serve_is_the_recommended_entrypoint(host: SimHost) -> None:
    run = on_host(host, server_argv(host, "--bogus-flag"))
    assert run.returncode == 2
    assert (
        "UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended "
        "entrypoint.\n  Example: sglang serve --model-path <model> [options]"
    ) in run.stderr


def sglang_cli(host: SimHost) -> str:
    """The console script pip installs next to the host's python."""
    return str(host.python.parent / "sglang")


def test_sglang_serve_help_has_a_header_then_the_server_help(host: SimHost) -> None:
    run = on_host(host, [sglang_cli(host), "serve", "--help"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "Usage: sglang serve <model-name-or-path> [additional-arguments]"
    llm = run.stdout.split("\n--- Help for Standard Language Model Server ---\n", 1)[1]
    assert llm.startswith("usage: sglang serve [-h] ") and "--speculative-eagle-topk" in llm
    assert "UserWarning" not in run.stderr


def test_sglang_serve_model_type_llm_help_is_the_server_help_only(host: SimHost) -> None:
    run = on_host(host, [sglang_cli(host), "serve", "--model-type", "llm", "--help"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: sglang serve [-h] ") and "--- Help for" not in run.stdout
    bad = on_host(host, [sglang_cli(host), "serve", "--model-type=vision", "--help"])
    assert bad.returncode == 1
    assert bad.stderr.splitlines()[-1] == (
        "ValueError: Unknown serve backend 'vision'. Available values: auto, llm, diffusion."
    )


def test_sglang_serve_runs_the_same_server_without_the_warning(host: SimHost, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    argv = [sglang_cli(host), "serve", "--model-type", "llm", "--model-path", str(host.model_path), "--tp-size", "8"]
    server = start_on_host(host, [*argv, "--port", str(host.server_port), *MTP], log)
    try:
        wait_until(lambda: health(host) == 200, what="the server to be healthy")
        _, info = http_get(url(host, "/server_info"))
        assert info is not None and (info["speculative_algorithm"], info["max_running_requests"]) == ("EAGLE", 256)
    finally:
        assert stop(server) == 0
    text = log.read_text()
    assert "TP0] The server is fired up and ready to roll!" in text and "UserWarning" not in text


def test_sglang_serve_takes_the_model_as_a_positional_argument(host: SimHost) -> None:
    run = on_host(host, [sglang_cli(host), "serve", str(host.model_path), "--tp", "8", "--cuda-graph-max-bs", "1"])
    assert run.returncode == 2 and "sglang serve: error: ambiguous option: --cuda-graph-max-bs" in run.stderr


def test_console_scripts_are_the_simulated_packages_own() -> None:
    pyproject = Path(hostdisk.__file__).parent / "sglang_sim" / "python" / "pyproject.toml"
    section = pyproject.read_text().split("[project.scripts]\n", 1)[1].split("\n\n", 1)[0]
    scripts = {}
    for line in section.splitlines():
        name, entry = line.split(" = ")
        scripts[name] = entry.strip('"')
    assert scripts == hostdisk.CONSOLE_SCRIPTS


def test_help_lists_the_real_flag_names(host: SimHost) -> None:
    text = on_host(host, [str(host.python), "-m", "sglang.launch_server", "--help"]).stdout
    for flag in ("--model-path", "--tp-size", "--tensor-parallel-size", "--host", "--port", "--trust-remote-code",
                 "--attention-backend", "--mem-fraction-static", "--max-running-requests", "--speculative-algorithm",
                 "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--speculative-draft-model-path", "--decode-log-interval", "--cuda-graph-max-bs-decode",
                 "--chunked-prefill-size", "--context-length", "--kv-cache-dtype", "--disable-radix-cache",
                 "--enable-metrics", "--log-level"):  # fmt: skip
        assert re.search(rf"^ +(\S.*, )?{re.escape(flag)}[ ,\n]", text, re.MULTILINE), flag
    assert "--fp8-gemm-backend {auto,deep_gemm,flashinfer_trtllm,flashinfer_cutlass" in text


def test_server_crash_at_startup(host: SimHost, tmp_path: Path) -> None:
    host.set_knobs(server_fail="crash", startup_seconds=0.1)
    run = on_host(host, server_argv(host, *MTP))
    assert run.returncode == 1
    assert "TP0] Initialization failed. warmup error: Traceback (most recent call last):" in run.stderr
    assert "ready to roll" not in run.stderr and host.gpu_processes() == []
    assert "TP0]" not in run.stdout  # SGLang logs to stderr


def test_server_refuses_a_gpu_held_by_another_process(host: SimHost) -> None:
    holder = host.hold_gpu(5, memory_mib=20000)
    try:
        run = on_host(host, server_argv(host))
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_never_healthy_and_ignore_sigterm_faults(host: SimHost, tmp_path: Path) -> None:
    host.set_knobs(server_fail="never_healthy", startup_seconds=0.1)
    server = start_on_host(host, server_argv(host), tmp_path / "never.log")
    wait_until(lambda: "Uvicorn running" in (tmp_path / "never.log").read_text(), what="startup to end")
    assert health(host) == 503
    assert stop(server) == 0
    host.set_knobs(server_fail="ignore_sigterm")
    server = start_on_host(host, server_argv(host), tmp_path / "stubborn.log")
    wait_until(lambda: health(host) == 200, what="the server to be healthy")
    server.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        server.wait(timeout=0.5)
    assert pid_alive(server.pid) and health(host) == 200
    server.kill()
    assert server.wait(timeout=5) == -signal.SIGKILL


def test_tuned_triton_configs_make_decode_steps_faster(host: SimHost) -> None:
    probe = (
        "import sys; from sglang.srt.server_args import prepare_server_args as p; "
        "from sglang._sim.server import fp8_step_factor; from sglang._sim.model import load_config; "
        "a = p(sys.argv[1:]); print(round(fp8_step_factor(a, load_config(a.model_path)), 3))"
    )
    base = [str(host.python), "-c", probe, "--model-path", str(host.model_path), "--tp", "8"]

    def factor(*flags: str) -> float:
        return float(on_host(host, [*base, *flags]).stdout)

    assert factor() == 1.0  # auto: CUTLASS on sm_120
    assert factor("--fp8-gemm-backend", "triton") == 1.25  # Triton with default configs: slower
    shapes = [(1536, 4096), (4096, 1024), (512, 4096), (4096, 256), (8192, 1024)]
    files = [host.sglang_dir / CONFIGS / config_name(n, k) for n, k in shapes]
    for path in files:
        path.write_text('{"1": {}}\n')
    try:
        assert factor("--fp8-gemm-backend", "triton") == 0.85  # every shape tuned: faster than CUTLASS
    finally:
        for path in files:
            path.unlink()


def test_triton_lookups_without_mtp_skip_the_mtp_layer_shapes(host: SimHost) -> None:
    probe = (
        "import sys; from sglang.srt.server_args import prepare_server_args as p; "
        "from sglang._sim.server import configure_logging, fp8_step_factor; from sglang._sim.model import load_config; "
        "a = p(sys.argv[1:]).resolve_once(); configure_logging(); fp8_step_factor(a, load_config(a.model_path))"
    )
    argv = [str(host.python), "-c", probe, "--model-path", str(host.model_path), "--tp", "8"]
    run = on_host(host, [*argv, "--fp8-gemm-backend", "triton"])
    missing = re.findall(r"Config file not found at .*/N=(\d+),K=(\d+),", run.stderr)
    assert missing == [("1536", "4096"), ("4096", "1024"), ("512", "4096"), ("4096", "256"), ("8192", "1024")]


def test_a_knob_set_to_none_returns_to_its_default(fleet: SimFleet) -> None:
    host = fleet.hosts[0]
    host.set_knobs(accept_length=2.0, gpus=4)
    assert host.knobs()["accept_length"] == 2.0
    assert len(ssh(fleet, host, "nvidia-smi -L").stdout.splitlines()) == 4
    host.set_knobs(accept_length=None, gpus=None)
    assert "accept_length" not in host.knobs() and "gpus" not in host.knobs()
    assert len(ssh(fleet, host, "nvidia-smi -L").stdout.splitlines()) == 8


def test_flashinfer_autotune_caches_under_sglangs_default_dir_unless_disabled(host: SimHost, tmp_path: Path) -> None:
    """Issue 25 §4: the MoE runner DeepSeek-V4 resolves here (flashinfer_mxfp4) runs FlashInfer's autotune at
    launch; with SGLANG_CACHE_DIR unset its cache is SGLang's default ``~/.cache/sglang``, one file per TP rank."""
    default = Path(host.env()["HOME"]) / ".cache" / "sglang" / "flashinfer" / "autotune" / "0.6.14" / "sm120"
    for extra, log in (([], tmp_path / "on.log"), (["--disable-flashinfer-autotune"], tmp_path / "off.log")):
        server = start_on_host(host, server_argv(host, *extra), log)
        try:
            wait_until(lambda: health(host) == 200, what="the server to be healthy")
        finally:
            assert stop(server) == 0
    on = (tmp_path / "on.log").read_text()
    found = re.search(r"Running FlashInfer autotune with cache: (\S+)", on)
    assert found is not None and "FlashInfer autotune completed." in on
    cache = Path(found.group(1))
    assert cache.name == "rank_tp0_pp0_dp0.json" and cache.parent.parent == default
    assert re.fullmatch(r"[0-9a-f]{16}", cache.parent.name)  # SGLang's key: 16 hex digits of a sha256
    assert sorted(p.name for p in cache.parent.iterdir()) == [f"rank_tp{r}_pp0_dp0.json" for r in range(8)]
    assert "FlashInfer autotune" not in (tmp_path / "off.log").read_text()
