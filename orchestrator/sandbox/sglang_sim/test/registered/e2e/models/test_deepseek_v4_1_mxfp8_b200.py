"""DeepSeek-V4.1 MXFP8 on 4x B200 (simulated copy of upstream's test for orch's sandbox).

Another model than DeepSeek-V4-Flash: its dense weights use [32, 32] FP8 blocks (ue8m0 scales), served by
flashinfer_cutedsl on SM100. `orch recipe discover` must not take its flags for DeepSeek-V4's.
"""

import unittest

from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.kits.spec_decoding_kit import SpecDecodingMixin
from sglang.test.test_utils import DEFAULT_URL_FOR_TEST, CustomTestCase, popen_launch_server

register_cuda_ci(est_time=700, suite="stage-c-test-4-gpu-b200")

MODEL = "deepseek-ai/DeepSeek-V4.1"


class TestDSV41MXFP8B200(SpecDecodingMixin, CustomTestCase):
    accept_length_thres = 4.2

    @classmethod
    def setUpClass(cls):
        cls.model = MODEL
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.process = popen_launch_server(
            cls.model,
            cls.base_url,
            timeout=3600,
            other_args=["--trust-remote-code", "--tp", "4", "--speculative-algorithm", "DSPARK"],
        )

    @classmethod
    def tearDownClass(cls):
        kill_process_tree(cls.process.pid)


if __name__ == "__main__":
    unittest.main()
