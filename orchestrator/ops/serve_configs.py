"""The tuned FP8 configs a server would read at launch: the files on the host's disk, one source of truth.

SGLang reads ``<config dir>/N={N},K={K},device_name={GPU},...json`` when a Triton block-FP8 GEMM first
runs (reference §1.2). What is there decides what the server uses, whoever put it there; orch's tuning
record only adds for which commit orch tuned each one. ``serve`` reads this once per launch: its gate
(which backend to launch, what to warn about) and its "already serving as asked" check both use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from orchestrator.facts import tuner as tf
from orchestrator.facts.gpus import device_file_name
from orchestrator.inventory import Host
from orchestrator.recipe import Shape
from orchestrator.transport.base import Runner
from orchestrator.tuning.record import TuningRecord

# Prints {file name: mtime} of the JSON files in argv[1] ({} when the directory does not exist).
_LIST_SNIPPET = """
import json, os, sys
d = sys.argv[1]
names = [n for n in os.listdir(d) if n.endswith(".json")] if os.path.isdir(d) else []
print(json.dumps({n: os.stat(os.path.join(d, n)).st_mtime for n in names}))
"""


@dataclass(frozen=True)
class TunedConfigs:
    """This GPU's tuned config files in the directory the host's SGLang reads them from.

    ``config_dir`` None: the host's python could not say where (SGLang's fp8_kernel does not import)."""

    device: str
    config_dir: str | None
    files: dict[str, float] = field(default_factory=dict)  # file name -> mtime, this device's only

    def has(self, shape: Shape) -> bool:
        return tf.config_file_name(shape.n, shape.k, self.device) in self.files


def list_argv(python: str, config_dir: str) -> list[str]:
    return [python, "-c", _LIST_SNIPPET, config_dir]


def parse_listing(stdout: str, device: str) -> dict[str, float]:
    """The listing's files for ``device`` (nvidia-smi's name); other GPUs' files are left out."""
    try:
        listed = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except ValueError:
        return {}
    mark = f",device_name={device_file_name(device)},"
    return {str(n): float(t) for n, t in listed.items() if mark in str(n)} if isinstance(listed, dict) else {}


def read_configs(host: Host, runner: Runner, device: str) -> TunedConfigs:
    """Where the host's SGLang reads tuned configs (by importing its fp8_kernel) and this GPU's files there."""
    config_dir = tf.parse_discover(runner.run(tf.discover_argv(host.python), timeout=300).stdout).config_dir
    if config_dir is None:
        return TunedConfigs(device, None)
    listing = runner.run(list_argv(host.python, config_dir), timeout=60)
    return TunedConfigs(device, config_dir, parse_listing(listing.stdout, device) if listing.ok else {})


def tuned_elsewhere(shapes: list[Shape], record: TuningRecord, configs: TunedConfigs, commit: str) -> dict[str, str]:
    """Shapes whose file is there but that orch did not tune for this commit: key -> what is known of it."""
    found = {}
    for shape in shapes:
        if not configs.has(shape):
            continue
        done = record.installed.get(shape.key)
        if done is None or device_file_name(done.device) != device_file_name(configs.device):
            found[shape.key] = "not installed by orch"
        elif done.commit != commit:
            found[shape.key] = f"tuned at SGLang {done.commit[:10]}"
    return found
