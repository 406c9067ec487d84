"""Reading upstream registered tests' ``other_args`` with ast, and comparing them with a recipe."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.facts.server import canonical_flag
from orchestrator.facts.server_upstream import (
    FlagDiff,
    args_to_flags,
    diff_flags,
    extract_other_args,
    family_tests,
    list_tests_argv,
    model_family,
)

UPSTREAM_V4_FLASH = """
import unittest
from sglang.test.test_utils import DEFAULT_URL_FOR_TEST, CustomTestCase, popen_launch_server

DEEPSEEK_V4_FLASH_MODEL_PATH = "deepseek-ai/DeepSeek-V4-Flash"
TP = 8


class TestDeepseekV4FlashFp4MTP(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = DEEPSEEK_V4_FLASH_MODEL_PATH
        other_args = [
            "--trust-remote-code",
            "--tp",
            str(TP),
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--mem-fraction-static",
            "0.85",
        ]
        cls.process = popen_launch_server(cls.model, cls.base_url, other_args=other_args)

    def test_gsm8k(self):
        server_info = requests.get(self.base_url + "/server_info").json()
        avg_spec_accept_length = server_info["internal_states"][0]["avg_spec_accept_length"]
        self.assertGreater(avg_spec_accept_length, 2.8)
"""


def test_extracts_other_args_resolving_constants_and_the_asserted_accept_length() -> None:
    (found,) = extract_other_args(UPSTREAM_V4_FLASH, "test/registered/e2e/models/test_deepseek_v4_flash.py")
    assert found.scope == "TestDeepseekV4FlashFp4MTP.setUpClass"
    assert found.args[:3] == ["--trust-remote-code", "--tp", "8"]
    assert found.args[-2:] == ["--mem-fraction-static", "0.85"]
    assert found.min_accept_length == 2.8


# Shaped like upstream's test/registered/e2e/models/test_deepseek_v4_flash_fp4_b200.py (reference §2.3):
# TP 4, the threshold a class attribute read through self.
UPSTREAM_B200_CLASS_ATTRIBUTE = """
import unittest
from sglang.test.test_utils import DEFAULT_URL_FOR_TEST, CustomTestCase, popen_launch_server

SERVER_LAUNCH_TIMEOUT = 3600


class TestDeepseekV4FlashFp4B200(CustomTestCase):
    accept_length_thres = 2.8

    @classmethod
    def setUpClass(cls):
        other_args = [
            "--trust-remote-code", "--tp", "4",
            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
            "--chunked-prefill-size", "4096", "--disable-flashinfer-autotune",
        ]
        cls.process = popen_launch_server(
            "deepseek-ai/DeepSeek-V4-Flash", DEFAULT_URL_FOR_TEST, timeout=SERVER_LAUNCH_TIMEOUT, other_args=other_args
        )

    def test_accept_length(self):
        server_info = requests.get(self.base_url + "/server_info").json()
        avg_spec_accept_length = server_info["internal_states"][0]["avg_spec_accept_length"]
        self.assertGreater(avg_spec_accept_length, self.accept_length_thres)
"""

# Shaped like upstream's test/registered/amd/test_deepseek_v4_pro_fp4_mtp.py: a named module constant.
UPSTREAM_AMD_NAMED_CONSTANT = """
AVG_SPEC_ACCEPT_LENGTH_THRESHOLD = 2.8
GSM8K_ACCURACY_THRESHOLD = 0.94


class TestDeepseekV4ProFp4MTP(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        other_args = ["--trust-remote-code", "--tp", "8", "--attention-backend", "dsv4"]
        cls.process = popen_launch_server(cls.model, cls.base_url, other_args=other_args)

    def test_a_gsm8k(self):
        self.assertGreater(metrics["accuracy"], GSM8K_ACCURACY_THRESHOLD)

    def test_b_accept_length(self):
        avg_spec_accept_length = server_info["internal_states"][0]["avg_spec_accept_length"]
        self.assertGreaterEqual(avg_spec_accept_length, AVG_SPEC_ACCEPT_LENGTH_THRESHOLD)
"""


@pytest.mark.parametrize(
    ("source", "bound"),
    [(UPSTREAM_B200_CLASS_ATTRIBUTE, 2.8), (UPSTREAM_AMD_NAMED_CONSTANT, 2.8)],
    ids=["class-attribute", "named-constant"],
)
def test_finds_an_accept_length_threshold_given_by_name(source: str, bound: float) -> None:
    (found,) = extract_other_args(source, "t.py")
    assert found.min_accept_length == bound


def test_the_class_attribute_threshold_of_the_b200_test_and_its_tp_4() -> None:
    (found,) = extract_other_args(UPSTREAM_B200_CLASS_ATTRIBUTE, "t.py")
    assert found.args[:3] == ["--trust-remote-code", "--tp", "4"]
    assert found.args[-3:] == ["--chunked-prefill-size", "4096", "--disable-flashinfer-autotune"]


@pytest.mark.parametrize(
    ("assertion", "bound"),
    [
        ("assert acc_len_of(info)['accept_length'] > THRESHOLD", 2.5),
        ("assert THRESHOLD <= avg_spec_accept_length", 2.5),
        ("self.assertLess(cls.bound, avg_accept_length)", 3.1),
        ("self.assertGreater(accept_length, Base.bound)", 3.1),
        ("self.assertGreater(metrics['accuracy'], THRESHOLD)", None),
        ("self.assertGreater(accept_length, unknown_name)", None),
        ("self.assertGreater(accept_length, True)", None),
    ],
)
def test_accept_length_assertions_in_their_common_forms(assertion: str, bound: float | None) -> None:
    source = textwrap.dedent(
        f"""
        THRESHOLD: float = 2.5

        class Base(CustomTestCase):
            bound = 3.1

        class TestMTP(Base):
            def setUp(self):
                other_args = ["--tp-size", "8"]

            def test_accept(self):
                {assertion}
        """
    )
    (found,) = extract_other_args(source, "t.py")
    assert found.min_accept_length == bound


# Shaped like the B200 file as upstream has it now: four classes, thresholds as class attributes that
# mixins of sglang.test.kits assert (in another file), flags as an other_args= keyword.
UPSTREAM_B200_MIXINS = """
SERVER_LAUNCH_TIMEOUT = 3600


class TestDSV4FlashFP4B200MTP(SpecDecodingMixin, GSM8KMixin, CustomTestCase):
    gsm8k_accuracy_thres = 0.93
    accept_length_thres = 2.8
    bs_1_speed_thres = 220

    @classmethod
    def setUpClass(cls):
        cls.process = popen_launch_server(
            cls.model, cls.base_url, timeout=SERVER_LAUNCH_TIMEOUT,
            other_args=["--trust-remote-code", "--tp", "4", "--speculative-algorithm", "EAGLE"],
        )


class TestDSV4FlashFP4B200DSpark(SpecDecodingMixin, GSM8KMixin, CustomTestCase):
    accept_length_thres = 4.0

    @classmethod
    def setUpClass(cls):
        cls.process = popen_launch_server(cls.model, cls.base_url, other_args=["--speculative-algorithm", "DSPARK"])


class TestDSV4FlashFP4NonSpecB200(GSM8KMixin, CustomTestCase):
    gsm8k_accuracy_thres = 0.93

    @classmethod
    def setUpClass(cls):
        cls.process = popen_launch_server(cls.model, cls.base_url, other_args=["--tp", "4", "--dp", "4"])
"""


def test_a_threshold_attribute_a_mixin_asserts_belongs_to_its_class_only() -> None:
    found = extract_other_args(UPSTREAM_B200_MIXINS, "t.py")
    assert [(e.scope, e.min_accept_length) for e in found] == [
        ("TestDSV4FlashFP4B200MTP.setUpClass", 2.8),
        ("TestDSV4FlashFP4B200DSpark.setUpClass", 4.0),
        ("TestDSV4FlashFP4NonSpecB200.setUpClass", None),
    ]
    assert found[0].args[:3] == ["--trust-remote-code", "--tp", "4"]


def test_a_module_constant_named_for_the_threshold_covers_classes_without_their_own() -> None:
    source = "MIN_ACCEPT_LENGTH = 3.0\n\nclass A:\n    def setUp(self):\n        other_args = ['--a']\n"
    assert [e.min_accept_length for e in extract_other_args(source, "t.py")] == [3.0]


def test_each_class_gets_the_threshold_it_asserts() -> None:
    source = textwrap.dedent(
        """
        class A:
            accept_length_thres = 2.8
            def setUp(self):
                other_args = ["--a"]
            def test(self):
                self.assertGreater(accept_length, self.accept_length_thres)

        class B:
            accept_length_thres = 3.3
            def setUp(self):
                other_args = ["--b"]
            def test(self):
                self.assertGreater(accept_length, self.accept_length_thres)
        """
    )
    assert [(e.scope, e.min_accept_length) for e in extract_other_args(source, "t.py")] == [
        ("A.setUp", 2.8),
        ("B.setUp", 3.3),
    ]


def test_extracts_keyword_concatenation_extend_starred_and_unresolvable_parts() -> None:
    source = textwrap.dedent(
        """
        BASE = ["--tp", "8"]

        class A:
            PORT = 1234
            def setUp(self):
                other_args = BASE + ["--port", PORT]
                other_args.extend(["--enable-metrics"])
                other_args += [f"--x={PORT}", helper()]

        def test_b():
            popen_launch_server("m", "u", other_args=[*BASE, "--dp", str(dp)])
        """
    )
    a, b = extract_other_args(source, "t.py")
    assert a.scope == "A.setUp"
    assert a.args == ["--tp", "8", "--port", "1234", "--enable-metrics", "--x=1234", "{helper()}"]
    assert (b.scope, b.args) == ("test_b", ["--tp", "8", "--dp", "{dp}"])
    assert a.min_accept_length is None


def test_other_args_passed_by_name_is_not_counted_twice() -> None:
    source = "def f():\n    other_args = ['--tp', '2']\n    launch(other_args=other_args)\n"
    assert [e.args for e in extract_other_args(source, "t.py")] == [["--tp", "2"]]


def test_invalid_python_raises_syntax_error() -> None:
    with pytest.raises(SyntaxError):
        extract_other_args("def (:\n", "bad.py")


@pytest.mark.parametrize(
    ("model", "family"),
    [("DeepSeek-V4-Flash", "deepseek_v4"), ("Qwen3-235B-A22B", "qwen3"), ("Llama-3.1-8B", "llama_3.1"), ("gpt", "gpt")],
)
def test_model_family(model: str, family: str) -> None:
    assert model_family(model) == family


def test_family_tests_match_paths_loosely_and_include_named_tests() -> None:
    paths = [
        "/s/test/registered/amd/test_deepseek_v4_pro_fp4_mtp.py",
        "/s/test/registered/e2e/models/test_deepseek_v4_flash_fp4_b200.py",
        "/s/test/registered/e2e/models/test_llama31_8b_eagle3.py",
        "/s/test/registered/e2e/test_other.py",
    ]
    assert family_tests(paths, "deepseek_v4") == paths[:2]
    assert family_tests(paths, "llama_3.1") == [paths[2]]
    assert family_tests(paths, "nothing", named=["e2e/test_other.py"]) == [paths[3]]


def test_deepseek_v4_tests_are_found_under_dsv4_names_and_v4_1_tests_are_another_model() -> None:
    mtp = "/s/test/registered/4-gpu-models/test_dsv4_mtp.py"
    h200 = "/s/test/registered/e2e/dsv4/test_dsv4_flash_h200.py"
    v41 = ["/s/test/registered/e2e/models/test_deepseek_v4_1_mxfp8.py", "/s/test/registered/e2e/dsv4/test_dsv41_pd.py"]
    assert family_tests([mtp, h200, *v41], "deepseek_v4") == [mtp, h200]


def test_list_tests_argv() -> None:
    assert list_tests_argv("/root/sg lang/") == ["find", "/root/sg lang/test/registered", "-name", "*.py", "-type", "f"]


def test_args_to_flags() -> None:
    flags = args_to_flags(["--tp", "8", "--trust-remote-code", "--x=1", "--cuda-graph-bs", "1", "2", "4"])
    assert flags == {"tp": "8", "trust-remote-code": "", "x": "1", "cuda-graph-bs": "1 2 4"}


def test_diff_flags_leaves_out_host_specific_flags() -> None:
    ours = ["--model-path", "/m", "--port", "30000", "--tp", "8", "--fp8-gemm-backend", "triton"]
    ours += ["--mem-fraction-static", "0.85"]
    theirs = ["--tp", "8", "--mem-fraction-static", "0.8", "--attention-backend", "aiter"]
    diffs = diff_flags(ours, theirs)
    assert diffs == [
        FlagDiff("tp", "8", "8"),
        FlagDiff("fp8-gemm-backend", "triton", None),
        FlagDiff("mem-fraction-static", "0.85", "0.8"),
        FlagDiff("attention-backend", None, "aiter"),
    ]
    assert [d.kind for d in diffs] == ["same", "recipe only", "differs", "upstream only"]


def test_diff_flags_compares_flags_under_their_canonical_names() -> None:
    known = ["--tp-size", "--trust-remote-code"]
    diffs = diff_flags(["--tp-size", "8"], ["--tp", "4", "--trust-remote-code"], lambda n: canonical_flag(n, known))
    assert [(d.flag, d.recipe, d.upstream, d.kind) for d in diffs] == [
        ("tp-size", "8", "4", "differs"),
        ("trust-remote-code", None, "", "upstream only"),
    ]
