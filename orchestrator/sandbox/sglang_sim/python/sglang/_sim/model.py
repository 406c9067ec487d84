"""The model's ``config.json`` and the block-FP8 GEMM shapes the simulated server runs.

For ``y = x W^T`` with W of shape (N, K): a column-parallel layer divides N by TP, a row-parallel
layer divides K. DeepseekV4ForCausalLM (per layer; names as in the model):

    wqkv_a      hidden -> q_lora_rank + head_dim, replicated: N = q_lora_rank + head_dim,  K = hidden_size
                (wq_a and wkv fused, SGLANG_OPT_FUSE_WQA_WKV on by default; unfused: two shapes)
    wq_b        q_lora_rank -> heads*head_dim, column-par.:   N = heads*head_dim / tp,     K = q_lora_rank
    wo_b        o_groups*o_lora_rank -> hidden, row-par.:     N = hidden_size,             K = o_groups*o_lora_rank / tp
    shared_experts.gate_up_proj, column-parallel:             N = 2*moe_inter*shared / tp, K = hidden_size
    shared_experts.down_proj, row-parallel:                   N = hidden_size,             K = moe_inter*shared / tp
    indexer.wq_b (layers with the sparse-attention indexer), replicated:
                                                              N = index_n_heads*index_head_dim, K = q_lora_rank
    with MTP on (speculative decoding), the NextN layer's e_proj and h_proj, replicated:
                                                              N = hidden_size,             K = hidden_size

Reference §1.3 calls the last two "probably" (if the checkpoint stores them in FP8): the simulation
assumes it does, so a ``--fp8-gemm-backend triton`` launch looks them up (and logs a missing file).

DeepseekV3ForCausalLM: the tuner's fixed DeepSeek-V3 list. Other architectures: no block-FP8 GEMMs.
"""

import json
import os


def load_config(model_path):
    with open(os.path.join(model_path, "config.json")) as f:
        return json.load(f)


def architecture(config):
    return (config.get("architectures") or ["LlamaForCausalLM"])[0]


def deepseek_v4_shapes(config, tp, mtp=False):
    """(name, N, K) of every block-FP8 linear of a DeepSeek-V4 layer on ``tp`` GPUs (``mtp``: and of
    the NextN layer speculative decoding adds)."""
    hidden, heads, head_dim = config["hidden_size"], config["num_attention_heads"], config["head_dim"]
    shared = config.get("moe_intermediate_size", 0) * config.get("n_shared_experts", 0)
    if os.environ.get("SGLANG_OPT_FUSE_WQA_WKV", "1") not in ("0", "false", "False"):
        shapes = [("wqkv_a", config["q_lora_rank"] + head_dim, hidden)]
    else:
        shapes = [("wq_a", config["q_lora_rank"], hidden), ("wkv", head_dim, hidden)]
    shapes += [
        ("wq_b", heads * head_dim // tp, config["q_lora_rank"]),
        ("wo_b", hidden, config["o_groups"] * config["o_lora_rank"] // tp),
    ]
    if shared:
        shapes += [("shared_experts.gate_up_proj", 2 * shared // tp, hidden),
                   ("shared_experts.down_proj", hidden, shared // tp)]
    if config.get("index_n_heads"):
        shapes.append(("indexer.wq_b", config["index_n_heads"] * config["index_head_dim"], config["q_lora_rank"]))
    if mtp and config.get("num_nextn_predict_layers"):
        shapes += [("mtp.e_proj", hidden, hidden), ("mtp.h_proj", hidden, hidden)]
    return shapes


def fp8_gemm_shapes(config, tp, mtp=False):
    """(name, N, K) of the block-FP8 GEMMs the server runs for this model (``mtp``: with speculative
    decoding on)."""
    arch = architecture(config)
    if arch == "DeepseekV4ForCausalLM":
        return deepseek_v4_shapes(config, tp, mtp)
    if arch == "DeepseekV3ForCausalLM":
        from sglang._sim.tuner import get_weight_shapes

        return [(f"linear_{i}", n, k) for i, (n, k) in enumerate(get_weight_shapes(tp))]
    return []
