import unittest
from types import SimpleNamespace

import requests

from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.few_shot_gsm8k import run_eval as run_eval_few_shot_gsm8k
from sglang.test.test_utils import (
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    CustomTestCase,
    popen_launch_server,
)

register_cuda_ci(est_time=300, suite="stage-b-test-1-gpu")

TARGET_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT_MODEL = "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"


class TestLlama31Eagle3(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = TARGET_MODEL
        cls.base_url = DEFAULT_URL_FOR_TEST
        other_args = [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            DRAFT_MODEL,
            "--speculative-num-steps",
            "5",
            "--speculative-eagle-topk",
            "8",
            "--speculative-num-draft-tokens",
            "32",
            "--mem-fraction-static",
            "0.7",
            "--dtype",
            "float16",
        ]
        cls.process = popen_launch_server(
            cls.model,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            other_args=other_args,
        )

    @classmethod
    def tearDownClass(cls):
        kill_process_tree(cls.process.pid)

    def test_gsm8k(self):
        requests.get(self.base_url + "/flush_cache")
        args = SimpleNamespace(
            num_shots=5,
            data_path=None,
            num_questions=200,
            max_new_tokens=512,
            parallel=128,
            host="http://127.0.0.1",
            port=int(self.base_url.split(":")[-1]),
        )
        metrics = run_eval_few_shot_gsm8k(args)
        self.assertGreater(metrics["accuracy"], 0.75)

        server_info = requests.get(self.base_url + "/server_info").json()
        self.assertGreater(server_info["internal_states"][0]["avg_spec_accept_length"], 3.0)


if __name__ == "__main__":
    unittest.main()
