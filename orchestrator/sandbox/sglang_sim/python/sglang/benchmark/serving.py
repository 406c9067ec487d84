"""Benchmark online serving throughput: ``python -m sglang.benchmark.serving --backend sglang ...``.

Sends ``--num-prompts`` requests to a running server's ``/generate`` (at most ``--max-concurrency`` at a
time, arriving at ``--request-rate`` per second), prints a summary and appends one JSON line of metrics
to ``--output-file``. As the real one (0.5.23, ``benchmark/datasets/random.py``): ``random`` samples the
text of a ShareGPT-format ``--dataset-path`` (the first turn of each conversation, repeated or cut to the
asked length) and, without a valid local file, downloads ShareGPT from the Hugging Face hub, which fails
on a host without internet (here: always); ``random-ids`` needs no file. The seed defaults to 42.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

WORDS = ["alpha", "beta", "gamma", "delta", "kernel", "tensor", "token", "model", "serve", "graph"]


@dataclass
class RequestOutput:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    latency: float = 0.0
    ttft: float = 0.0
    itl: list = field(default_factory=list)
    error: str = ""


def build_parser():
    parser = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    parser.add_argument("--backend", type=str, default="sglang",
                        choices=["sglang", "sglang-native", "sglang-oai", "vllm", "lmdeploy", "trt"])
    parser.add_argument("--base-url", type=str, default=None, help="Server or API base url if not using http host and port.")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Default host is 0.0.0.0.")
    parser.add_argument("--port", type=int, help="If not set, the default port is configured according to its default value for different LLM Inference Engines.")
    parser.add_argument("--dataset-name", type=str, default="sharegpt",
                        choices=["sharegpt", "random", "random-ids", "generated-shared-prefix", "mmmu"])
    parser.add_argument("--dataset-path", type=str, default="", help="Path to the dataset.")
    parser.add_argument("--model", type=str, help="Name or path of the model. If not set, the default model will request /v1/models for conf.")
    parser.add_argument("--tokenizer", type=str, help="Name or path of the tokenizer.")
    parser.add_argument("--num-prompts", type=int, default=1000, help="Number of prompts to process. Default is 1000.")
    parser.add_argument("--random-input-len", type=int, default=1024, help="Number of input tokens per request, used only for random dataset.")
    parser.add_argument("--random-output-len", type=int, default=1024, help="Number of output tokens per request, used only for random dataset.")
    parser.add_argument("--random-range-ratio", type=float, default=0.0, help="Range of sampled ratio of input/output length, used only for random dataset.")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="Number of requests per second. Default is inf (all at once).")
    parser.add_argument("--max-concurrency", type=int, default=None, help="Maximum number of concurrent requests.")
    parser.add_argument("--output-file", type=str, help="Output JSONL file name.")
    parser.add_argument("--output-details", action="store_true", help="Output details of benchmarking.")
    parser.add_argument("--disable-tqdm", action="store_true", help="Specify to disable tqdm progress bar.")
    parser.add_argument("--disable-stream", action="store_true", help="Disable streaming mode.")
    parser.add_argument("--disable-ignore-eos", action="store_true", help="Disable ignoring EOS.")
    parser.add_argument("--seed", type=int, default=42, help="The random seed.")
    parser.add_argument("--warmup-requests", type=int, default=1, help="Number of warmup requests to run before the benchmark.")
    parser.add_argument("--extra-request-body", type=str, default=None, help="Append given JSON object to the request payload.")
    parser.add_argument("--tag", type=str, default=None, help="The tag to be dumped to output.")
    parser.add_argument("--apply-chat-template", action="store_true", help="Apply chat template")
    return parser


def base_url_of(args):
    if args.base_url:
        return args.base_url.rstrip("/")
    return f"http://{args.host}:{args.port or 30000}"


SHAREGPT_REPO_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"


class LocalEntryNotFoundError(OSError):
    """What ``huggingface_hub.hf_hub_download`` raises without a network and without a cached copy."""


LocalEntryNotFoundError.__module__ = "huggingface_hub.errors"


def is_file_valid_json(path):
    if not os.path.isfile(path):
        return False
    try:
        with open(path) as f:
            json.load(f)
        return True
    except ValueError as e:
        print(f"{path} exists but json loading fails ({e=}), thus treat as invalid file")
        return False


def hf_hub_download(repo_id, filename, repo_type="dataset"):
    """The simulated hosts have no internet: the download fails as the real one does offline."""
    raise LocalEntryNotFoundError(
        "An error happened while trying to locate the file on the Hub and we cannot find the requested files "
        "in the local cache. Please check your connection and try again or make sure your Internet connection "
        "is on."
    )


def random_lengths(rng, full_len, range_ratio, num):
    return [rng.randint(max(int(full_len * range_ratio), 1), full_len) for _ in range(num)]


def sample_random_requests(args):
    """(prompt, prompt_len, output_len) for ``random`` (the dataset's text) and ``random-ids`` (random
    words standing for random token ids), reproducible with ``--seed``; a word stands for a token."""
    rng = random.Random(args.seed)
    input_lens = random_lengths(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    output_lens = random_lengths(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    if args.dataset_name == "random-ids":
        return [(" ".join(rng.choice(WORDS) for _ in range(n)), n, m) for n, m in zip(input_lens, output_lens)]
    dataset_path = args.dataset_path
    if not is_file_valid_json(dataset_path):
        dataset_path = hf_hub_download(repo_id=SHAREGPT_REPO_ID, filename=SHAREGPT_FILENAME)
    with open(dataset_path) as f:
        dataset = json.load(f)
    turns = [d.get("conversations", d.get("conversation", [])) for d in dataset]
    prompts = [t[0]["value"].split() for t in turns if len(t) >= 2 and t[0]["value"].split()]
    rng.shuffle(prompts)
    requests = []
    for words, n, m in zip(prompts, input_lens, output_lens):
        repeated = (words * ((n + len(words) - 1) // len(words)))[:n]
        requests.append((" ".join(repeated), n, m))
    return requests


def load_requests(args):
    if args.dataset_name in ("random", "random-ids"):
        return sample_random_requests(args)
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        hf_hub_download(repo_id=SHAREGPT_REPO_ID, filename=SHAREGPT_FILENAME)
    raise ValueError(f"Dataset {args.dataset_name} is not supported offline by this build; use random.")


def post_generate(base_url, payload, timeout=600):
    """Open a POST /generate; returns the live HTTP response."""
    url = urllib.parse.urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    conn.request("POST", "/generate", body=json.dumps(payload), headers={"Content-Type": "application/json"})
    return conn.getresponse()


def send_request(base_url, prompt, prompt_len, output_len, stream, extra):
    payload = {"text": prompt, "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True},
               "stream": stream, **extra}
    out = RequestOutput(prompt_len=prompt_len)
    start = last = time.perf_counter()
    try:
        response = post_generate(base_url, payload)
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read().decode(errors='replace')}")
        chunks = _sse_chunks(response) if stream else [json.loads(response.read())]
        for chunk in chunks:
            now = time.perf_counter()
            if out.ttft == 0.0:
                out.ttft = now - start
            else:
                out.itl.append(now - last)
            last, out.output_len = now, chunk["meta_info"]["completion_tokens"]
        out.latency, out.success = time.perf_counter() - start, True
    except Exception as error:  # a failed request is counted, not fatal
        out.error = f"{type(error).__name__}: {error}"
    return out


def _sse_chunks(response):
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def run_requests(args, base_url, requests, extra):
    """Send every request (bounded concurrency, Poisson arrivals); (outputs, duration in seconds)."""
    workers = args.max_concurrency or min(len(requests), 256) or 1
    rng = random.Random(args.seed)
    bar = _Progress(len(requests), args.disable_tqdm)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = []
        for prompt, prompt_len, output_len in requests:
            future = pool.submit(send_request, base_url, prompt, prompt_len, output_len, not args.disable_stream, extra)
            future.add_done_callback(lambda _f: bar.update())
            futures.append(future)
            if args.request_rate != float("inf"):
                time.sleep(rng.expovariate(args.request_rate))
        outputs = [f.result() for f in futures]
    bar.close()
    return outputs, time.perf_counter() - start


class _Progress:
    def __init__(self, total, disabled):
        self.total, self.done, self.disabled = total, 0, disabled
        self.lock = threading.Lock()

    def update(self):
        with self.lock:
            self.done += 1
            if not self.disabled:
                sys.stderr.write(f"\r{100 * self.done // max(self.total, 1):3d}%| {self.done}/{self.total}")
                sys.stderr.flush()

    def close(self):
        if not self.disabled:
            sys.stderr.write("\n")


def fetch_accept_length(base_url):
    """The server's average speculative accept length, or None when speculative decoding is off."""
    url = urllib.parse.urlparse(base_url)
    for path in ("/server_info", "/get_server_info"):
        try:
            conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=10)
            conn.request("GET", path)
            response = conn.getresponse()
            if response.status == 200:
                states = json.loads(response.read()).get("internal_states") or [{}]
                return states[0].get("avg_spec_accept_length")
        except (OSError, ValueError):
            continue
    return None


def _ms(values, stat):
    if not values:
        return 0.0
    if stat == "mean":
        return statistics.fmean(values) * 1000
    if stat == "median":
        return statistics.median(values) * 1000
    if stat == "std":
        return statistics.pstdev(values) * 1000
    return sorted(values)[min(len(values) - 1, int(len(values) * stat / 100))] * 1000


def calculate_metrics(args, outputs, duration, accept_length):
    ok = [o for o in outputs if o.success]
    total_in, total_out = sum(o.prompt_len for o in ok), sum(o.output_len for o in ok)
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    itls, e2e, ttfts = [x for o in ok for x in o.itl], [o.latency for o in ok], [o.ttft for o in ok]
    metrics = {
        "backend": args.backend, "dataset_name": args.dataset_name, "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "duration": duration, "completed": len(ok), "total_input_tokens": total_in,
        "total_output_tokens": total_out, "total_output_tokens_retokenized": total_out,
        "request_throughput": len(ok) / duration, "input_throughput": total_in / duration,
        "output_throughput": total_out / duration, "total_throughput": (total_in + total_out) / duration,
        "concurrency": sum(e2e) / duration, "accept_length": accept_length, "tag": args.tag,
        # not in the real result: orch labels these numbers simulated (as the simulated profiler's traces)
        "simulated": {"by": "orch's simulated SGLang", "model": "sglang/_sim/throughput.py"},
    }
    for name, values, stats in (("e2e_latency", e2e, ("mean", "median", "std", 99)),
                                ("ttft", ttfts, ("mean", "median", "std", 99)),
                                ("tpot", tpots, ("mean", "median", "std", 99)),
                                ("itl", itls, ("mean", "median", "std", 95, 99, 100))):
        for stat in stats:
            label = {100: "max"}.get(stat, stat if isinstance(stat, str) else f"p{stat}")
            metrics[f"{label}_{name}_ms"] = _ms(values, stat)
    return metrics


def print_summary(m):
    line = "{:<40} {:<10}".format
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Backend:", m["backend"]))
    print(line("Traffic request rate:", m["request_rate"]))
    print(line("Max request concurrency:", m["max_concurrency"] or "not set"))
    print(line("Successful requests:", m["completed"]))
    print("{:<40} {:<10.2f}".format("Benchmark duration (s):", m["duration"]))
    print(line("Total input tokens:", m["total_input_tokens"]))
    print(line("Total generated tokens:", m["total_output_tokens"]))
    print(line("Total generated tokens (retokenized):", m["total_output_tokens_retokenized"]))
    for label, key in (("Request throughput (req/s):", "request_throughput"),
                       ("Input token throughput (tok/s):", "input_throughput"),
                       ("Output token throughput (tok/s):", "output_throughput"),
                       ("Total token throughput (tok/s):", "total_throughput"),
                       ("Concurrency:", "concurrency")):
        print("{:<40} {:<10.2f}".format(label, m[key]))
    if m["accept_length"]:
        print("{:<40} {:<10.2f}".format("Accept length:", m["accept_length"]))
    _print_latencies(m)
    print("=" * 50)


STAT_LABELS = {"mean": "Mean", "median": "Median", "p95": "P95", "p99": "P99", "max": "Max"}


def _print_latencies(m):
    sections = (("End-to-End Latency", "e2e_latency", "E2E Latency", ("mean", "median")),
                ("Time to First Token", "ttft", "TTFT", ("mean", "median", "p99")),
                ("Time per Output Token (excl. 1st token)", "tpot", "TPOT", ("mean", "median", "p99")),
                ("Inter-Token Latency", "itl", "ITL", ("mean", "median", "p95", "p99", "max")))
    for title, key, short, stats in sections:
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat in stats:
            print("{:<40} {:<10.2f}".format(f"{STAT_LABELS[stat]} {short} (ms):", m[f"{stat}_{key}_ms"]))


def warmup(args, base_url, requests, extra):
    if args.warmup_requests <= 0:
        return
    print(f"Starting warmup with {args.warmup_requests} sequences...")
    prompt, prompt_len, _ = requests[0]
    output = send_request(base_url, prompt, prompt_len, min(16, args.random_output_len), False, extra)
    if not output.success:
        raise ValueError("Initial test run failed - Please make sure benchmark arguments are correctly "
                         f"specified. Error: {output.error}")
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")


def run_benchmark(args):
    print(f"benchmark_args={args}")
    base_url = base_url_of(args)
    extra = json.loads(args.extra_request_body) if args.extra_request_body else {}
    requests = load_requests(args)
    print(f"#Input tokens: {sum(r[1] for r in requests)}")
    print(f"#Output tokens: {sum(r[2] for r in requests)}")
    warmup(args, base_url, requests, extra)
    outputs, duration = run_requests(args, base_url, requests, extra)
    metrics = calculate_metrics(args, outputs, duration, fetch_accept_length(base_url))
    if metrics["completed"] == 0:
        warnings.warn("All requests failed. This is likely due to a misconfiguration on the benchmark arguments.")
    print_summary(metrics)
    output_file = args.output_file or (f"{args.backend}_{datetime.now().strftime('%m%d')}_{args.num_prompts}_"
                                       f"{args.random_input_len}_{args.random_output_len}.jsonl")
    with open(output_file, "a") as f:
        f.write(json.dumps(metrics) + "\n")
    return metrics


def main(argv=None):
    args = build_parser().parse_args(argv)
    run_benchmark(args)


if __name__ == "__main__":
    main()
