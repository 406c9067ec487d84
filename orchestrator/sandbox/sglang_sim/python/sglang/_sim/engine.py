"""The simulated scheduler: decode steps over the running requests, with speculative decoding.

Every step takes ``throughput.step_seconds`` (the empty-batch ``step_seconds`` grown with the batch's
tokens, MTP draft tokens and DP attention: see ``throughput.py``) and gives each running request one
token, or the accept length (``throughput.accept_length`` of the draft tokens) with speculative decoding
on (one verify step). Every ``decode_log_interval`` steps it logs a
``Decode batch`` line and updates the running average accept length that ``/server_info`` reports.
"""

import logging
import os
import threading
import time
import uuid

from sglang._sim import throughput

logger = logging.getLogger("sglang.srt.managers.scheduler")

WORDS = [" the", " model", " serves", " tokens", " quickly", " and", " well", "."]


class Request:
    def __init__(self, prompt_tokens, max_new_tokens):
        self.rid = uuid.uuid4().hex
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max(1, int(max_new_tokens))
        self.generated = 0.0
        self.verify_ct = 0
        self.created = time.monotonic()
        self.finished = False

    @property
    def completion_tokens(self):
        return min(self.max_new_tokens, int(self.generated))

    def text(self):
        return "".join(WORDS[i % len(WORDS)] for i in range(self.completion_tokens))

    def advance(self, tokens):
        self.generated += tokens
        self.verify_ct += 1
        self.finished = self.completion_tokens >= self.max_new_tokens


class Engine:
    """Runs decode steps in a thread; HTTP handlers ``submit`` requests and wait on ``changed``."""

    def __init__(self, server_args, step_seconds, accept_length):
        self.args = server_args
        self.spec = server_args.speculative_algorithm is not None
        self.step_seconds = step_seconds
        self.draft_tokens = (server_args.speculative_num_draft_tokens or 1) if self.spec else 1
        # attention-DP as SGLang resolves it: `--dp-size N --enable-dp-attention` becomes attn_dp_size N
        self.dp_attention = getattr(server_args, "attn_dp_size", 1) > 1 or bool(getattr(server_args, "enable_dp_attention", False))
        self.tokens_per_step = throughput.accept_length(accept_length, self.draft_tokens) if self.spec else 1.0
        self.max_running = server_args.max_running_requests or 128
        self.changed = threading.Condition()
        self.waiting, self.running = [], []
        self.steps = self.interval_tokens = self.total_accepted = self.total_verify = 0
        self.interval_start = time.monotonic()
        self.avg_accept_length = None
        self.last_gen_throughput = 0.0
        self.profiler = None  # the server's Profiler (profiler.py): told of every batch the scheduler runs

    def start(self):
        threading.Thread(target=self._loop, name="scheduler", daemon=True).start()

    def submit(self, request):
        with self.changed:
            self.waiting.append(request)
            self.changed.notify_all()

    def in_flight(self):
        with self.changed:
            return [r.rid for r in self.running + self.waiting]

    def internal_state(self):
        state = {"last_gen_throughput": round(self.last_gen_throughput, 2), "#running-req": len(self.running),
                 "#queue-req": len(self.waiting), "memory_usage": {"weight": 38.5, "kvcache": 40.1}}
        if self.spec and self.avg_accept_length is not None:
            state["avg_spec_accept_length"] = round(self.avg_accept_length, 4)
        return state

    def _loop(self):
        while True:
            with self.changed:
                while not self.waiting and not self.running:
                    self.changed.wait()
                    self.interval_start = time.monotonic()
                self._admit()
                batch = len(self.running)
            time.sleep(throughput.step_seconds(self.step_seconds, batch, self.draft_tokens, self.dp_attention))
            with self.changed:
                self._step()
                self.changed.notify_all()

    def _admit(self):
        admitted = []
        while self.waiting and len(self.running) < self.max_running:
            admitted.append(self.waiting.pop(0))
        self.running += admitted
        if admitted and self.profiler is not None:  # the new requests' prefill is one batch
            self.profiler.batch("prefill", sum(r.prompt_tokens for r in admitted), 0.0)

    def _step(self):
        if self.profiler is not None and self.running:
            draft = self.args.speculative_num_draft_tokens if self.spec else 1
            context = sum(r.prompt_tokens + r.completion_tokens for r in self.running) / len(self.running)
            self.profiler.batch("decode", len(self.running) * (draft or 1), context / 1000)
        for request in self.running:
            before = request.completion_tokens
            request.advance(self.tokens_per_step)
            self.interval_tokens += request.completion_tokens - before
        self.total_accepted += self.tokens_per_step * len(self.running)
        self.total_verify += len(self.running)
        batch = len(self.running)
        self.running = [r for r in self.running if not r.finished]
        self.steps += 1
        if self.steps % self.args.decode_log_interval == 0:
            self._log_decode_batch(batch)

    def _log_decode_batch(self, batch):
        elapsed = max(time.monotonic() - self.interval_start, 1e-6)
        self.last_gen_throughput = self.interval_tokens / elapsed
        self.interval_tokens, self.interval_start = 0, time.monotonic()
        spec = ""
        if self.spec:
            self.avg_accept_length = self.total_accepted / self.total_verify
            rate = self.tokens_per_step / self.args.speculative_num_draft_tokens
            spec = f"accept len: {self.tokens_per_step:.2f}, accept rate: {rate:.2f}, "
        cuda_graph = not self.args.disable_cuda_graph and batch <= self.args.cuda_graph_max_bs_decode
        tokens = sum(r.prompt_tokens + r.completion_tokens for r in self.running)
        iters = f" [{self.steps}]" if os.environ.get("SGLANG_LOG_FORWARD_ITERS", "").lower() in ("1", "true") else ""
        logger.info(f"Decode batch{iters}, #running-req: {batch}, #token: {tokens}, token usage: {tokens / 1048576:.2f}, "
                    f"{spec}cuda graph: {cuda_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
                    f"#queue-req: {len(self.waiting)}")
