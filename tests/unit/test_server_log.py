"""Server log parsers against recorded lines (reference §1-2): ready, failures, FP8 lookups, decode."""

from __future__ import annotations

import pytest

from orchestrator.facts.server_log import (
    ConfigFile,
    ShapeUse,
    parse_config_path,
    parse_server_log,
    shape_use,
    strip_prefix,
    traceback_error,
)

DIR = "/root/sglang/python/sglang/kernels/ops/gemm/configs"
DEV = "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"


def cfg(n: int, k: int) -> str:
    return f"{DIR}/N={n},K={k},device_name={DEV},dtype=fp8_w8a8,block_shape=[128, 128].json"


READY_LOG = f"""[2026-11-29 22:34:00 TP0] server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash', ...)
[2026-11-29 22:34:00 TP0] Load weight begin. avail mem=95.59 GB
[2026-11-29 22:34:01 TP0] Using configuration from {cfg(1024, 4096)} for W8A8 Block FP8 kernel.
[2026-11-29 22:34:01 TP0] Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! Config file not found at {cfg(4096, 2048)}
[2026-11-29 22:34:02 TP0] The server is fired up and ready to roll!
[2026-11-29 22:34:03] INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 200 OK
[2026-11-29 22:34:09 TP0] Decode batch, #running-req: 1, #token: 140, token usage: 0.00, accept len: 3.10, accept rate: 0.78, cuda graph: True, gen throughput (token/s): 123.45, #queue-req: 0
[2026-11-29 22:34:10 TP0] Decode batch, #running-req: 1, #token: 180, token usage: 0.00, cuda graph: True, gen throughput (token/s): 99.00, #queue-req: 0
"""  # noqa: E501

CRASH_LOG = """[2026-11-29 22:34:00 TP0] Load weight begin. avail mem=95.59 GB
[2026-11-29 22:34:05 TP0] Initialization failed. warmup error: Traceback (most recent call last):
  File "/root/sglang/python/sglang/_sim/server.py", line 120, in warmup_failure
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
RuntimeError: CUDA error: an illegal memory access was encountered
"""

TRACEBACK_LOG = """[2026-11-29 22:34:00 TP0] server_args=...
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/root/sglang/python/sglang/srt/server_args.py", line 90, in _handle_speculative_decoding
    raise ValueError(f"Unknown speculative algorithm name: {name}")
ValueError: Unknown speculative algorithm name: MTP
"""


def test_ready_log_with_fp8_lookups_and_decode_lines() -> None:
    log = parse_server_log(READY_LOG)
    assert log.ready and log.failure is None
    assert log.configs_used == [ConfigFile(1024, 4096, DEV, cfg(1024, 4096))]
    assert [c.shape for c in log.configs_missing] == [(4096, 2048)]
    assert log.accept_lengths == [3.1]


RESOLVED_LOG = """[2026-12-03 09:18:45] Setting swa_full_tokens_ratio to 0.1 for DeepseekV4ForCausalLM.
[2026-12-03 09:18:45] Use dsv4 attention backend for DeepseekV4ForCausalLM, setting page_size to 256.
[2026-12-03 09:18:45] Use flashinfer_mxfp4 as MoE runner backend for DeepseekV4ForCausalLM.
[2026-12-03 09:18:45] Setting KV cache dtype to fp8_e4m3 for DeepseekV4ForCausalLM.
[2026-12-03 09:18:45] Setting max_running_requests to 256 for DeepseekV4ForCausalLM.
[2026-12-03 09:19:02 TP0] The server is fired up and ready to roll!
[2026-12-03 09:19:09 TP0] Decode batch [1234], #running-req: 1, #token: 140, token usage: 0.00, accept len: 4.62, accept rate: 0.52, cuda graph: True, gen throughput (token/s): 123.45, #queue-req: 0
"""  # noqa: E501


def test_the_settings_the_server_resolved_are_read_from_its_model_hook_lines() -> None:
    log = parse_server_log(RESOLVED_LOG)
    assert log.resolved == {
        "attention_backend": "dsv4",
        "page_size": "256",
        "moe_runner_backend": "flashinfer_mxfp4",
        "max_running_requests": "256",
    }


def test_a_decode_line_numbered_by_log_forward_iters_still_gives_the_accept_length() -> None:
    assert parse_server_log(RESOLVED_LOG).accept_lengths == [4.62]


def test_initialization_failed_is_the_failure() -> None:
    log = parse_server_log(CRASH_LOG)
    assert not log.ready
    assert log.failure == (  # not cut at the traceback's first line, which said nothing
        "Initialization failed. warmup error: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_a_traceback_is_a_failure_with_its_exception_line() -> None:
    assert parse_server_log(TRACEBACK_LOG).failure == "ValueError: Unknown speculative algorithm name: MTP"


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (["Traceback (most recent call last):", '  File "x", line 1'], None),  # still being written
        (["nothing wrong"], None),
        (
            [
                "Traceback (most recent call last):",
                '  File "a"',
                "KeyError: 'x'",
                "",
                "During handling of the above exception, another exception occurred:",
                "",
                "Traceback (most recent call last):",
                '  File "b"',
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            ],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ),
    ],
)
def test_traceback_error(lines: list[str], error: str | None) -> None:
    assert traceback_error(lines) == error


def test_strip_prefix_and_carriage_returns() -> None:
    assert strip_prefix("[2026-11-29 22:34:00 TP0] hello\n") == "hello"
    assert strip_prefix("[2026-11-29 22:34:00 TP3 EP1] x") == "x"
    assert strip_prefix("10%\r50%\r[2026-11-29 22:34:00 TP0] done") == "done"


def test_parse_config_path() -> None:
    assert parse_config_path(cfg(4096, 256)) == ConfigFile(4096, 256, DEV, cfg(4096, 256))
    assert parse_config_path("/x/something.json") is None


def test_shape_use_in_use_missing_and_cutlass_on_sm120() -> None:
    log = parse_server_log(READY_LOG)
    report = shape_use(log, [(1024, 4096), (4096, 2048), (512, 4096)], "triton", "12.0")
    assert report[0] == ShapeUse(1024, 4096, True, cfg(1024, 4096))
    assert not report[1].in_use and report[1].path == cfg(4096, 2048)
    assert "no tuned config file for this GPU and SGLang commit (run `orch tune-fp8`)" in report[1].reason
    assert not report[2].in_use and "logged no config lookup" in report[2].reason
    cutlass = shape_use(parse_server_log(""), [(1024, 4096)], None, "12.0")[0]
    assert "fp8-gemm-backend auto runs block-FP8 GEMMs on CUTLASS on sm_120" in cutlass.reason
    assert cutlass.key == "N=1024,K=4096"
    other = shape_use(parse_server_log(""), [(1024, 4096)], "deep_gemm", "9.0")[0]
    assert "fp8-gemm-backend deep_gemm" in other.reason


def test_shape_use_reports_every_shape_the_log_shows_not_only_the_recipes() -> None:
    log = parse_server_log(
        READY_LOG + f"[2026-11-29 22:34:01 TP0] Using default W8A8 Block FP8 kernel config. Performance might be "
        f"sub-optimal! Config file not found at {cfg(8192, 1024)}\n"
    )
    report = shape_use(log, [(4096, 2048)], "triton", "12.0")
    assert [(s.key, s.in_use, s.listed) for s in report] == [
        ("N=4096,K=2048", False, True),
        ("N=1024,K=4096", True, False),  # read although the recipe does not list it
        ("N=8192,K=1024", False, False),  # looked up, no file, not in the recipe: reported too
    ]
    assert "not in the recipe's tuning.shapes" in report[2].reason and report[2].path == cfg(8192, 1024)


@pytest.mark.parametrize(
    "line",
    [
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
        "OSError: [Errno 98] Address already in use",
    ],
)
def test_a_bind_error_is_the_startup_failure_said_as_such(line: str) -> None:
    log = parse_server_log(f"[2026-01-01 00:00:00] server_args=ServerArgs(port=30000)\n{line}\n")
    assert log.failure == f"could not bind its port (another process listens there): {line}"
