#!/usr/bin/env bash
# The conformance tier: orch's argv, flag checks and parsers judged by the REAL SGLang 0.5.23 package.
#
# Creates .venv-sglang/ (reused when its import check passes) with CPU torch, `sglang==0.5.23 --no-deps`,
# the modules its imports need (shared/reference/sglang.md §4, plus triton, which sglang.srt.utils.common
# imports), orch itself (editable) and pytest; then runs `pytest tests/conformance "$@"` in it, so orch's
# own code builds the argv in the same interpreter as the real parser. Any failed step fails the tier:
# nothing in it is skipped. No GPU is needed; the first install takes a minute or two (torch is large).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-sglang
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
SGLANG_IMPORTS=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm
  ipython aiohttp huggingface-hub triton)
READY_CHECK="import sglang, sglang.srt.server_args, sglang.srt.utils.common, orchestrator, pytest
assert sglang.__version__ == '$SGLANG_VERSION', sglang.__version__"

pip() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

if "$VENV/bin/python" -c "$READY_CHECK" 2>/dev/null; then
  echo "== conformance: reusing $VENV (SGLang $SGLANG_VERSION)"
  pip -e . # orch's own dependencies may have changed since the venv was made
else
  echo "== conformance: installing the real SGLang $SGLANG_VERSION into $VENV"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # Here pip takes the CPU wheel that lies on this machine's disk (pip's find-links); on a machine
  # without it, the registry's build (CUDA, several GB; it imports and runs on a CPU all the same).
  pip "torch==$TORCH_VERSION"
  pip --no-deps "sglang==$SGLANG_VERSION"
  pip "${SGLANG_IMPORTS[@]}"
  pip -e . pytest
  "$VENV/bin/python" -c "$READY_CHECK"
fi
echo "== conformance: pytest tests/conformance"
exec "$VENV/bin/python" -m pytest tests/conformance "$@"
