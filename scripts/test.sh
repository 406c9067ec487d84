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
# The real SGLang Model Gateway for the gateway tests (issues 12, 23), both packages, each in its own
# virtualenv (its web stack stays out of orch's): `smg` (today's) and its predecessor `sglang-router`
# (ended at 0.3.2). tests/gateway_smg.py finds them there.
ensure_gateway() {  # VENV PACKAGE VERSION: reused when `pip show` already reports that version
  "$1/bin/python" -m pip show "$2" 2>/dev/null | grep -qx "Version: $3" || {
    [ -x "$1/bin/python" ] || python3 -m venv "$1"
    "$1/bin/python" -m pip install -q --disable-pip-version-check "$2==$3"
  }
}
ensure_gateway .venv-smg113 smg 1.13.0
ensure_gateway .venv-smg sglang-router 0.3.2
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
# Three workers (pytest-xdist), a test file each at a time: the integration tests mostly wait on sshd and
# simulated servers, so three at once keep a 2-core machine busy (1,930 tests in 17:13 in a clean clone,
# the rolling tests split; two took 24:10). Four were no faster (17:10-19:42, a load-timing test failed once).
# Each worker runs `orch` by forking a process that imported it once (tests/forkserver.py;
# ORCH_TEST_FRESH=1 starts a fresh interpreter for every run instead).
echo "== pytest"; .venv/bin/pytest -n "${TEST_WORKERS:-3}" --dist loadfile "$@"
echo "== conformance (real SGLang)"; bash scripts/conformance.sh
