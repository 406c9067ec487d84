#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine (as root), then run every check:
# ruff (lint + format), mypy --strict, the whole pytest suite (unit + integration over real sshd; arguments
# go to this pytest), then the conformance tier against the real SGLang package (scripts/conformance.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_setup.sh
ensure_system_packages openssh-server
ensure_venv '.[dev]'
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/pytest "$@"
echo "== conformance (real SGLang)"; bash scripts/conformance.sh
