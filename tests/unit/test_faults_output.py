"""Hostile or broken host output: every parser raises one typed error (``HostOutputError``) or returns
a safe "unknown", never another exception (issue 13, requirement 7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from orchestrator import server_job as server_ops
from orchestrator.errors import HostOutputError
from orchestrator.facts import gpus, probe, server, tuner
from orchestrator.state import ServerRecord

GOOD_GPU = "0, NVIDIA H100 80GB HBM3, GPU-aaa, 81559, 1, 0, 9.0"
BAD_UTF8 = b"0, NVIDIA \xff\xfe H100, GPU-\x80, 81559, 1, 0, 9.0".decode(errors="replace")
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "kv_lora_rank": 512,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "q_lora_rank": 1536,
}
ENTRY = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def _http(*answers: Any) -> str:
    return json.dumps(list(answers))


def _shapes(config: Any) -> Any:
    return tuner.shapes_from_model_config(config, 8)


# (id, parser, hostile input); each must raise HostOutputError or return a safe value.
CASES: list[tuple[str, Callable[[Any], Any], Any]] = [
    ("gpus-index-not-a-number", gpus.parse_gpus, "abc, H100, GPU-a, 81559, 1, 0, 9.0"),
    ("gpus-memory-inf", gpus.parse_gpus, "0, H100, GPU-a, 1e400, 1, 0, 9.0"),
    ("gpus-missing-fields", gpus.parse_gpus, "0, H100, GPU-a"),
    ("gpus-garbage-lines", gpus.parse_gpus, "Failed to initialize NVML: Driver/library version mismatch"),
    ("gpus-huge-line", gpus.parse_gpus, "x" * 5_000_000),
    ("gpus-huge-output", gpus.parse_gpus, (GOOD_GPU + "\n") * 100_000 + "garbage"),
    ("gpus-invalid-utf8", gpus.parse_gpus, BAD_UTF8),
    ("gpus-index-negative-float", gpus.parse_gpus, "-1.5, H100, GPU-a, 81559, 1, 0, 9.0"),
    ("apps-pid-not-a-number", gpus.parse_apps, "abc, python, GPU-a, 100"),
    ("apps-missing-fields", gpus.parse_apps, "123, python"),
    ("apps-memory-nan", gpus.parse_apps, "123, python, GPU-a, nan"),
    ("http-empty", server.parse_http, ""),
    ("http-html", server.parse_http, "<html><body>502 Bad Gateway</body></html>"),
    ("http-not-a-list-of-answers", server.parse_http, _http(1, 2)),
    ("http-status-missing", server.parse_http, _http({"body": "x"})),
    ("http-status-not-a-number", server.parse_http, _http({"status": "ok", "body": "x"})),
    ("http-deep-json", server.parse_http, "[" * 100_000 + "]" * 100_000),
    ("server-info-list", server.spec_settings, [1, 2, 3]),
    ("server-info-html-string", server.spec_settings, "<html>"),
    ("server-info-steps-x", server.spec_settings, {"speculative_algorithm": "EAGLE", "speculative_num_steps": "x"}),
    ("server-info-topk-object", server.spec_settings, {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": {}}),
    ("server-info-steps-inf", server.spec_settings, {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1e400}),
    ("server-info-algorithm-list", server.spec_settings, {"speculative_algorithm": ["EAGLE"]}),
    ("fp8-backend-list", server.fp8_backend, ["auto"]),
    ("accept-length-list", server.avg_accept_length, ["x"]),
    ("accept-length-html", server.avg_accept_length, "<html>"),
    ("tuned-not-json", lambda t: tuner.parse_config(t, "f.json"), "<html>"),
    ("tuned-invalid-utf8", lambda t: tuner.parse_config(t, "f.json"), b"{\xff\xfe}"),
    ("tuned-list", lambda t: tuner.parse_config(t, "f.json"), "[1, 2]"),
    ("tuned-wrong-types", lambda t: tuner.parse_config(t, "f.json"), json.dumps({"1": {**ENTRY, "num_warps": "4"}})),
    ("tuned-missing-keys", lambda t: tuner.parse_config(t, "f.json"), json.dumps({"1": {"num_warps": 4}})),
    ("tuned-unicode-digit-key", lambda t: tuner.parse_config(t, "f.json"), json.dumps({"\u00b2": ENTRY})),
    ("tuned-deep-json", lambda t: tuner.parse_config(t, "f.json"), "[" * 100_000 + "]" * 100_000),
    ("model-config-hidden-size-abc", _shapes, {**V3, "hidden_size": "abc"}),
    ("model-config-hidden-size-zero", _shapes, {**V3, "hidden_size": 0}),
    ("model-config-negative", _shapes, {**V3, "v_head_dim": -128}),
    ("model-config-list", _shapes, [1, 2]),
    ("model-config-architectures-int", _shapes, {**V3, "architectures": 3}),
    ("model-config-architectures-object", _shapes, {**V3, "architectures": [{}]}),
]


@pytest.mark.parametrize(("parse", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_output_is_a_typed_error_or_unknown(parse: Callable[[Any], Any], text: Any) -> None:
    try:
        parse(text)
    except (HostOutputError, tuner.UnknownArchitecture) as exc:
        assert str(exc) and len(str(exc)) < 2_000  # says what was wrong, without echoing a flood


def test_nvidia_smi_error_names_the_field() -> None:
    with pytest.raises(HostOutputError, match=r"field 1 'abc' is not a number"):
        gpus.parse_gpus("abc, H100, GPU-a, 81559, 1, 0, 9.0")


def test_server_info_steps_x_names_the_key() -> None:
    with pytest.raises(HostOutputError, match=r"speculative_num_steps 'x' is not a whole number"):
        server.spec_settings({"speculative_algorithm": "EAGLE", "speculative_num_steps": "x"})


def test_unknowns_stay_unknown() -> None:
    """Answers that only lack something give "unknown", not an error."""
    assert gpus.parse_gpus(GOOD_GPU.replace(" 0, 9.0", " [N/A], 9.0"))[0].utilization_pct is None
    assert server.avg_accept_length({"internal_states": "x"}) is None
    assert server.fp8_backend({"fp8_gemm_runner_backend": 3}) is None
    assert probe.parse("@@orch-section begin a\nx\n@@orch-section end a zz")["a"].exit_status == -1


def test_status_shows_odd_speculative_settings_as_unknown() -> None:
    """`orch status` reading ``speculative_num_steps: "x"`` from /server_info: that field unknown, the rest shown."""
    info = {"speculative_algorithm": "EAGLE", "speculative_num_steps": "x"}
    http = _http({"status": 200, "body": "OK"}, {"status": 200, "body": json.dumps(info)})
    record = ServerRecord(job_id="j", argv=["sglang"], port=30000, mtp=True)
    field = server_ops.status_field(http, "", record, datetime.now(timezone.utc))
    assert field is not None
    assert field["speculative"] == "unknown (/server_info: speculative_num_steps 'x' is not a whole number)"


def test_status_carries_what_the_server_resolved_as_verified_beside_what_was_asked() -> None:
    from orchestrator.state import Verification

    verified = Verification(resolved={"moe_runner_backend": "flashinfer_mxfp4"}, asked={"moe_runner_backend": "auto"})
    record = ServerRecord(job_id="j", argv=["sglang"], port=30000, mtp=True, verified=verified)
    field = server_ops.status_field("", "", record, datetime.now(timezone.utc))
    assert field is not None and field["resolved"] == "MoE runner flashinfer_mxfp4 (asked auto)"
    bare = server_ops.status_field("", "", record.model_copy(update={"verified": None}), datetime.now(timezone.utc))
    assert bare is not None and bare["resolved"] is None


def test_a_model_config_nested_absurdly_deep_is_a_refusal_not_a_recursion_error(tmp_path: Path) -> None:
    from orchestrator.errors import RefusedError
    from orchestrator.inventory import Host
    from orchestrator.session import HostSession
    from orchestrator.store import StateStore
    from orchestrator.transport.local import LocalRunner
    from orchestrator.tuning.prepare import auto_shapes

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    host = Host.model_validate(
        {"name": "h1", "address": "127.0.0.1", "workdir": str(tmp_path / "w"), "model_path": str(tmp_path / "model")}
    )
    with pytest.raises(RefusedError, match="cannot read the model's"):
        auto_shapes(HostSession(host, LocalRunner(host), StateStore(tmp_path / "state.json")), 8)
