#!/usr/bin/env bash
# Install orch into .venv and run `orch demo`: a simulated two-host GPU fleet on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_setup.sh
ensure_venv '.[report]'
exec .venv/bin/orch demo "$@"
