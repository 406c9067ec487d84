"""The ``config.json`` of the simulated DeepSeek-V4-Flash model on every sandbox host.

Its dimensions are the real model's (``srt/configs/deepseek_v4.py`` defaults, reference §1.3). Block-FP8
GEMM shapes follow from it by this rule (``y = x W^T``, W is (N, K); a column-parallel layer divides N
by TP, a row-parallel layer divides K), which the simulated server also uses:

==============================  ====================================  =================================
linear                          N                                     K
==============================  ====================================  =================================
``wqkv_a`` (replicated; wq_a    q_lora_rank + head_dim                hidden_size = 4096
and wkv fused by default)       = 1024 + 512 = 1536
``wq_b`` (column-parallel)      num_attention_heads*head_dim/tp       q_lora_rank = 1024
                                = 64*512/8 = 4096
``wo_b`` (row-parallel)         hidden_size = 4096                    o_groups*o_lora_rank/tp
                                                                      = 8*1024/8 = 1024
shared expert gate_up (col.)    2*moe_intermediate_size*shared/tp     hidden_size = 4096
                                = 2*2048*1/8 = 512
shared expert down (row)        hidden_size = 4096                    moe_intermediate_size*shared/tp
                                                                      = 2048*1/8 = 256
indexer ``wq_b`` (replicated)   index_n_heads*index_head_dim          q_lora_rank = 1024
                                = 64*128 = 8192
MTP ``e_proj``, ``h_proj``      hidden_size = 4096                    hidden_size = 4096
(replicated; MTP on only)
==============================  ====================================  =================================

So on 8 GPUs the server looks up five shapes: (1536, 4096), (4096, 1024), (512, 4096), (4096, 256),
(8192, 1024); with MTP on also (4096, 4096). Reference §1.3 marks the last two "probably" (if the
checkpoint stores them in FP8); the simulation assumes it does.
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL_NAME = "DeepSeek-V4-Flash"

DEEPSEEK_V4_FLASH: dict[str, object] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
    "hidden_size": 4096,
    "num_hidden_layers": 43,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1024,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "hidden_act": "silu",
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2048,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 1,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}


# A DSpark draft bundled in the checkpoint's `dspark/` folder (SGLang's `_target_checkpoint_dspark_subfolder`
# defaults `--speculative-draft-model-path` to it); gamma 7, SGLang's default.
DSPARK_DRAFT: dict[str, object] = {"architectures": ["DSparkDeepseekV4DraftModel"], "block_size": 7}

WEIGHTS_INDEX = "model.safetensors.index.json"
"""The weights' index of a sharded checkpoint."""

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
"""The weight shards the model's index names: a few bytes each (``orch doctor`` checks they exist and are
not empty; nothing loads them)."""


def write_model(models_dir: Path, *, dspark: bool = True) -> Path:
    """Create ``models_dir/DeepSeek-V4-Flash/``: ``config.json``, the shard index
    (``model.safetensors.index.json``, as Hugging Face writes it) and its shards, and a bundled
    ``dspark/config.json`` draft unless ``dspark`` is false; return the directory."""
    model = models_dir / MODEL_NAME
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(DEEPSEEK_V4_FLASH, indent=2) + "\n")
    weight_map = {"model.embed_tokens.weight": SHARDS[0], "lm_head.weight": SHARDS[1]}
    for shard in SHARDS:
        (model / shard).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    index = {"metadata": {"total_size": 16 * len(SHARDS)}, "weight_map": weight_map}
    (model / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    if dspark:
        (model / "dspark").mkdir(exist_ok=True)
        (model / "dspark" / "config.json").write_text(json.dumps(DSPARK_DRAFT, indent=2) + "\n")
    return model
