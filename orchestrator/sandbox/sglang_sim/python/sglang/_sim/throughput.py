"""The simulated server's throughput model: how long one decode step takes, and how many tokens it gives.

One small model, so that a sweep over concurrency, MTP depth and DP attention has the shape upstream's
DeepSeek-V4 recipes describe (MTP helps at low concurrency and costs at high; DP attention pays off with
many requests). A step over ``batch`` requests processes ``tokens = batch x draft_tokens`` tokens (one per
request without speculative decoding) and takes

    base x dp_overhead x (1 + 0.02 x tokens / attention_split + 0.005 x tokens)

seconds, where ``base`` is the server's empty-batch step (knob ``decode_step_seconds``, times the FP8 GEMM
factor and, with MTP, ``spec_step_overhead``), the 0.02 term is attention (it grows with the tokens in the
batch; DP attention splits it over ``attention_split = 4`` groups of ranks), the 0.005 term the rest, and
``dp_overhead = 1.15`` with DP attention (its extra gathers), else 1. With MTP each request gains the accept
length per step: ``1 + (accept_length - 1) x min(draft_tokens - 1, 3) / 3`` (knob ``accept_length`` at 4 draft
tokens; 1.7 at 2 with the default 3.1). None of it is measured: it is a model, and says so.
"""

ATTENTION_PER_TOKEN = 0.02
OTHER_PER_TOKEN = 0.005
DP_ATTENTION_SPLIT = 4
DP_ATTENTION_OVERHEAD = 1.15


def accept_length(knob, draft_tokens):
    """Tokens a request gains per verify step with ``draft_tokens`` drafted (the knob is for 4)."""
    return 1 + (knob - 1) * min(max(draft_tokens - 1, 0), 3) / 3


def step_seconds(base, batch, draft_tokens, dp_attention):
    """Seconds of one decode step over ``batch`` requests (see the module's model)."""
    tokens = max(batch, 1) * max(draft_tokens, 1)
    split = DP_ATTENTION_SPLIT if dp_attention else 1
    overhead = DP_ATTENTION_OVERHEAD if dp_attention else 1.0
    return base * overhead * (1 + ATTENTION_PER_TOKEN * tokens / split + OTHER_PER_TOKEN * tokens)
