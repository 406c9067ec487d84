"""Deprecated: use ``python -m sglang.benchmark.serving`` (same flags)."""

import sys

if __name__ == "__main__":
    print("WARNING: `python -m sglang.bench_serving` is deprecated and will be removed in a future release. "
          "Please use `python -m sglang.benchmark.serving` instead.", file=sys.stderr, flush=True)
    from sglang.benchmark.serving import main

    main()
