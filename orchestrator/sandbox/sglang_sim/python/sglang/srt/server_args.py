"""The server's arguments: command-line flags, defaults and the rules that resolve them.

Simulated, but with SGLang's flag names and its speculative-decoding rules:
- ``--speculative-algorithm`` is upper-cased and must be a builtin name (``MTP`` is not one);
- DeepSeek-V4 accepts only EAGLE or DSPARK, and EAGLE needs ``--speculative-eagle-topk 1`` given
  explicitly (checked before NEXTN is mapped to EAGLE);
- the three numbers (steps, topk, draft tokens) are given all or none (none: (3, 1, 4));
- topk 1 forces draft tokens = steps + 1; EAGLE-family algorithms default max running requests to 48;
- DeepSeek NextN/MTP takes its draft model from the model itself.
"""

import argparse
import dataclasses
import logging
from typing import List, Optional

from sglang._sim.model import architecture, load_config

logger = logging.getLogger(__name__)

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO")
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE", "DSPARK")
DEEPSEEK_V4_ALGORITHMS = ("EAGLE", "DSPARK")
DEEPSEEK_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM")
FP8_GEMM_BACKENDS = ["auto", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_deepgemm",
                     "flashinfer_cutedsl", "cutlass", "triton", "aiter"]
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: Optional[str] = None
    served_model_name: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    quantization: Optional[str] = None
    kv_cache_dtype: str = "auto"
    context_length: Optional[int] = None
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    enable_dp_attention: bool = False
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    cuda_graph_max_bs: Optional[int] = None
    disable_cuda_graph: bool = False
    disable_radix_cache: bool = False
    page_size: Optional[int] = None
    attention_backend: Optional[str] = None
    moe_runner_backend: str = "auto"
    fp8_gemm_backend: str = "auto"
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    decode_log_interval: int = 40
    enable_metrics: bool = False
    log_level: str = "info"
    random_seed: Optional[int] = None
    watchdog_timeout: float = 300
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        _model_flags(parser)
        _parallel_flags(parser)
        _memory_flags(parser)
        _kernel_flags(parser)
        _speculative_flags(parser)
        _logging_flags(parser)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})

    def __post_init__(self):
        self.tokenizer_path = self.tokenizer_path or self.model_path
        self.served_model_name = self.served_model_name or self.model_path
        self.mem_fraction_static = self.mem_fraction_static or 0.9
        self.chunked_prefill_size = self.chunked_prefill_size or 8192
        self.page_size = self.page_size or 1
        self.random_seed = 42 if self.random_seed is None else self.random_seed
        self._handle_speculative_decoding()
        self.cuda_graph_max_bs = self.cuda_graph_max_bs or (64 if self.speculative_algorithm else 256)

    def _handle_speculative_decoding(self):
        if self.speculative_algorithm is None:
            return
        name = self.speculative_algorithm.upper()
        if name not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"Unknown speculative algorithm name: {name}")
        arch = architecture(load_config(self.model_path))
        if arch == "DeepseekV4ForCausalLM":
            _check_deepseek_v4(name, self.speculative_eagle_topk)
        self.speculative_algorithm = "EAGLE" if name == "NEXTN" else name
        if arch in DEEPSEEK_ARCHS and self.speculative_algorithm in EAGLE_FAMILY:
            if self.speculative_draft_model_path is not None:
                logger.warning("DeepSeek MTP does not require setting speculative_draft_model_path.")
            self.speculative_draft_model_path = self.model_path
        self._resolve_speculative_numbers()
        if self.speculative_algorithm in EAGLE_FAMILY and self.max_running_requests is None:
            self.max_running_requests = 48
            logger.warning("Max running requests is reset to 48 for speculative decoding. You can override "
                           "this by explicitly setting --max-running-requests.")

    def _resolve_speculative_numbers(self):
        numbers = (self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens)
        if all(n is None for n in numbers):
            self.speculative_num_steps, self.speculative_eagle_topk, self.speculative_num_draft_tokens = 3, 1, 4
            logger.warning("Auto choose speculative_num_steps=3, speculative_eagle_topk=1, "
                           "speculative_num_draft_tokens=4 for DeepSeek MTP.")
        elif any(n is None for n in numbers):
            raise ValueError("speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens "
                             "must be set together (or none of them)")
        if self.speculative_eagle_topk == 1 and self.speculative_num_draft_tokens != self.speculative_num_steps + 1:
            logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                           "speculative_eagle_topk == 1")
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1


def _check_deepseek_v4(name, topk):
    if name not in DEEPSEEK_V4_ALGORITHMS:
        raise ValueError(f"DeepSeek-V4 only supports speculative algorithm EAGLE or DSPARK, got {name}.")
    if name == "EAGLE" and topk != 1:
        raise ValueError("DeepSeek-V4 with EAGLE requires --speculative-eagle-topk 1 to be set explicitly.")


def _model_flags(parser):
    parser.add_argument("--model-path", "--model", type=str, required=True,
                        help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.")
    parser.add_argument("--tokenizer-path", type=str, default=None, help="The path of the tokenizer.")
    parser.add_argument("--served-model-name", type=str, default=None,
                        help="Override the model name returned by the v1/models endpoint in OpenAI API server.")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="Whether or not to allow for custom models defined on the Hub in their own modeling files.")
    parser.add_argument("--dtype", type=str, default="auto",
                        choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
                        help="Data type for model weights and activations.")
    parser.add_argument("--quantization", type=str, default=None, help="The quantization method.")
    parser.add_argument("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPES,
                        help='Data type for kv cache storage. "auto" will use model data type.')
    parser.add_argument("--context-length", type=int, default=None,
                        help="The model's maximum context length. Defaults to None (will use the value from the model's config.json instead).")
    parser.add_argument("--tool-call-parser", type=str, default=None, help="Parser for tool calls.")
    parser.add_argument("--reasoning-parser", type=str, default=None, help="Parser for reasoning content.")


def _parallel_flags(parser):
    parser.add_argument("--host", type=str, default="127.0.0.1", help="The host of the HTTP server.")
    parser.add_argument("--port", type=int, default=30000, help="The port of the HTTP server.")
    parser.add_argument("--tensor-parallel-size", "--tp-size", "--tp", type=int, default=1, dest="tp_size",
                        help="The tensor parallelism size.")
    parser.add_argument("--data-parallel-size", "--dp-size", "--dp", type=int, default=1, dest="dp_size",
                        help="The data parallelism size.")
    parser.add_argument("--expert-parallel-size", "--ep-size", "--ep", type=int, default=1, dest="ep_size",
                        help="The expert parallelism size.")
    parser.add_argument("--enable-dp-attention", action="store_true",
                        help="Enabling data parallelism for attention and tensor parallelism for FFN.")


def _memory_flags(parser):
    parser.add_argument("--mem-fraction-static", type=float, default=None,
                        help="The fraction of the memory used for static allocation (model weights and KV cache memory pool).")
    parser.add_argument("--max-running-requests", type=int, default=None, help="The maximum number of running requests.")
    parser.add_argument("--chunked-prefill-size", type=int, default=None,
                        help="The maximum number of tokens in a chunk for the chunked prefill.")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None, help="Set the maximum batch size for cuda graph.")
    parser.add_argument("--disable-cuda-graph", action="store_true", help="Disable cuda graph.")
    parser.add_argument("--disable-radix-cache", action="store_true", help="Disable RadixAttention for prefix caching.")
    parser.add_argument("--page-size", type=int, default=None, help="The number of tokens in a page.")


def _kernel_flags(parser):
    parser.add_argument("--attention-backend", type=str, default=None, help="Choose the kernels for attention layers.")
    parser.add_argument("--moe-runner-backend", type=str, default="auto", help="Choose the runner backend for MoE.")
    parser.add_argument("--fp8-gemm-backend", type=str, default="auto", choices=FP8_GEMM_BACKENDS,
                        help="Choose the runner backend for block-wise FP8 GEMM operations. 'auto' picks the "
                             "best backend for the device (CUTLASS on sm_120); 'triton' uses the tuned Triton "
                             "configs.")


def _speculative_flags(parser):
    parser.add_argument("--speculative-algorithm", type=str, default=None,
                        help="Speculative algorithm: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK, UNO.")
    parser.add_argument("--speculative-draft-model-path", "--speculative-draft-model", type=str, default=None,
                        help="The path of the draft model weights.")
    parser.add_argument("--speculative-num-steps", type=int, default=None,
                        help="The number of steps sampled from draft model in Speculative Decoding.")
    parser.add_argument("--speculative-eagle-topk", type=int, default=None,
                        help="The number of tokens sampled from the draft model in eagle2 each step.")
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                        help="The number of tokens sampled from the draft model in Speculative Decoding.")


def _logging_flags(parser):
    parser.add_argument("--decode-log-interval", type=int, default=40, help="The log interval of decode batch.")
    parser.add_argument("--enable-metrics", action="store_true", help="Enable log prometheus metrics.")
    parser.add_argument("--log-level", type=str, default="info", help="The logging level of all loggers.")
    parser.add_argument("--random-seed", type=int, default=None, help="The random seed.")
    parser.add_argument("--watchdog-timeout", type=float, default=300,
                        help="Set watchdog timeout in seconds. If a forward batch takes longer than this, the server will crash.")


def prepare_server_args(argv: List[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))
