"""The simulated checkout's copies of upstream's registered DeepSeek-V4 tests hold upstream's facts
(reference §2.3), shaped as upstream writes them, so that ``orch recipe discover`` reads the real thing."""

from __future__ import annotations

import ast
from pathlib import Path

from orchestrator.sandbox import hostdisk

REGISTERED = Path(hostdisk.__file__).parent / "sglang_sim" / "test" / "registered"
B200 = REGISTERED / "e2e" / "models" / "test_deepseek_v4_flash_fp4_b200.py"
AMD = REGISTERED / "amd" / "test_deepseek_v4_pro_fp4_mtp.py"
MTP = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
       "--speculative-num-draft-tokens", "4"]  # fmt: skip


def module_constants(tree: ast.Module) -> dict[str, object]:
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }


def other_args_keywords(node: ast.AST) -> list[list[str]]:
    """Every ``other_args=[...]`` keyword's literal strings (names such as DEEPEP_CONFIG kept as names)."""
    found = []
    for call in ast.walk(node):
        for keyword in getattr(call, "keywords", []):
            if keyword.arg == "other_args" and isinstance(keyword.value, ast.List):
                found.append(
                    [str(e.value) if isinstance(e, ast.Constant) else ast.unparse(e) for e in keyword.value.elts]
                )
    return found


def test_b200_mtp_class_launches_tp4_with_a_class_attribute_threshold() -> None:
    tree = ast.parse(B200.read_text())
    assert module_constants(tree)["SERVER_LAUNCH_TIMEOUT"] == 3600
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    mtp = classes["TestDSV4FlashFP4B200MTP"]
    attributes = {
        node.targets[0].id: ast.literal_eval(node.value)  # type: ignore[attr-defined]
        for node in mtp.body
        if isinstance(node, ast.Assign)
    }
    assert attributes["accept_length_thres"] == 2.8
    assert other_args_keywords(mtp) == [
        ["--trust-remote-code", "--tp", "4", *MTP, "--chunked-prefill-size", "4096", "--disable-flashinfer-autotune"]
    ]
    assert "assertGreater" not in B200.read_text()  # the spec-decoding mixin asserts, not this file
    every = [args for node in classes.values() for args in other_args_keywords(node)]
    assert len(every) == 4 and {args[args.index("--tp") + 1] for args in every} == {"4"}  # no TP 8 upstream


def test_amd_pro_file_has_the_mtp_block_with_dsv4_attention_and_a_named_threshold() -> None:
    tree = ast.parse(AMD.read_text())
    assert module_constants(tree)["AVG_SPEC_ACCEPT_LENGTH_THRESHOLD"] == 2.8
    (assign,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "other_args"
    ]
    flags = ast.literal_eval(assign.value)
    assert flags[flags.index("--attention-backend") + 1] == "dsv4"
    start = flags.index("--speculative-algorithm")
    assert flags[start : start + len(MTP)] == MTP
    assert "self.assertGreater(avg_spec_accept_length, AVG_SPEC_ACCEPT_LENGTH_THRESHOLD)" in AMD.read_text()
