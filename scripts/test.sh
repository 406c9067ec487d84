#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine (as root), then run every check:
# ruff (lint + format), mypy --strict, the whole pytest suite (unit + integration over real sshd; arguments
# go to this pytest), then the conformance tier against the real SGLang package (scripts/conformance.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_setup.sh
ensure_system_packages openssh-server
ensure_image_tools
ensure_venv '.[dev]'
# The real SGLang Model Gateway (smg) for the gateway tests (issue 12): its own virtualenv, so its web
# stack (fastapi, uvicorn, aiohttp) stays out of orch's; tests/gateway_smg.py finds it there.
SMG_VERSION=0.3.2
.venv-smg/bin/smg --version 2>/dev/null | grep -qx "sgl-model-gateway $SMG_VERSION" || {
  [ -x .venv-smg/bin/python ] || python3 -m venv .venv-smg
  .venv-smg/bin/python -m pip install -q --disable-pip-version-check "sglang-router==$SMG_VERSION"
}
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/pytest "$@"
echo "== conformance (real SGLang)"; bash scripts/conformance.sh
