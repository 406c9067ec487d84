#!/usr/bin/env bash
# The conformance tier: orch's argv, flag checks and parsers judged by the REAL SGLang 0.5.23 package.
#
# Creates .venv-sglang/ (reused when its import check passes) with CPU torch, `sglang==0.5.23 --no-deps`,
# the modules its imports need (shared/reference/sglang.md §4, plus triton, which sglang.srt.utils.common
# imports), orch itself (editable) and pytest; then runs `pytest tests/conformance "$@"` in it, so orch's
# own code builds the argv in the same interpreter as the real parser. Any failed step fails the tier:
# nothing in it is skipped. No GPU is needed. Measured on this 2-core machine: 2 to 3 minutes to install
# from scratch (torch is large), about 20 s when the virtualenv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-sglang
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
# The versions seen working with SGLang 0.5.23 here (pinned so the tier does not drift with the registry)
SGLANG_IMPORTS=(numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 packaging==26.4
  pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0 pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1
  aiohttp==3.14.5 huggingface-hub==2.4.0 triton==3.9.0)
READY_CHECK="import sglang, sglang.srt.server_args, sglang.srt.utils.common, orchestrator, pytest
assert sglang.__version__ == '$SGLANG_VERSION', sglang.__version__"

source scripts/_setup.sh
pip() { pip_quietly "$VENV/bin/python" "$@"; }

if "$VENV/bin/python" -c "$READY_CHECK" 2>/dev/null; then
  echo "== conformance: reusing $VENV (SGLang $SGLANG_VERSION)"
  # orch is installed editable (its code is read from here); reinstall only when its dependencies changed
  cmp -s pyproject.toml "$VENV/orch-pyproject.toml" || pip -e .
else
  echo "== conformance: installing the real SGLang $SGLANG_VERSION into $VENV"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  # Here pip takes the CPU wheel that lies on this machine's disk (pip's find-links); on a machine
  # without it, the registry's build (CUDA, several GB; it imports and runs on a CPU all the same).
  pip "torch==$TORCH_VERSION"
  pip --no-deps "sglang==$SGLANG_VERSION"
  echo "== conformance: sglang without its other requirements (CUDA kernels, the serving stack): the tier" \
    "imports only its argument parser and /server_info builder, so pip's notes about them are left out"
  pip "${SGLANG_IMPORTS[@]}"
  pip -e . pytest
  "$VENV/bin/python" -c "$READY_CHECK"
fi
cp pyproject.toml "$VENV/orch-pyproject.toml"
echo "== conformance: pytest tests/conformance"
exec "$VENV/bin/python" -m pytest tests/conformance "$@"
