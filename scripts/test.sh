#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine (as root), then run every check:
# ruff (lint + format), mypy --strict, and the whole pytest suite (unit + integration over real sshd).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_setup.sh
ensure_system_packages openssh-server
ensure_venv '.[dev]'
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/pytest "$@"
