"""A simulated ``flashinfer`` for sandbox hosts (copied into each host's venv as ``flashinfer``): only its
``__version__``, which SGLang puts in the autotune cache's path and orch reads to group identical hosts.

The version is the host's knob ``flashinfer_version`` (``<root>/knobs.json``; the root is
``$ORCH_SIM_HOST``), default ``0.6.14``: a simulated number, not a claim about what SGLang 0.5.23 pins.
Standard library only: it runs on the host's interpreter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_VERSION = "0.6.14"


def _version() -> str:
    root = os.environ.get("ORCH_SIM_HOST")
    try:
        knobs = json.loads((Path(root) / "knobs.json").read_text()) if root else {}
    except (OSError, ValueError):
        knobs = {}
    value = knobs.get("flashinfer_version") if isinstance(knobs, dict) else None
    return DEFAULT_VERSION if value is None else str(value)


__version__ = _version()
