"""The private disk of one simulated host, laid out under its root directory.

::

    <root>/bin/nvidia-smi               simulated nvidia-smi (hosttools/nvidia_smi.py)
    <root>/bin/dmesg, journalctl         simulated kernel log (hosttools/kernel_log.py)
    <root>/bin/df                       df; a full disk with knob ``disk_free_kib``/``_mib`` (hosttools/df.py)
    <root>/bin/mkdir                    mkdir; a job start fails on a full disk with ``job_start_fails``
    <root>/lib/                         the hosttools modules the programs in bin import (``install_tool``)
    <root>/bin/systemd-id128            prints <root>/etc/machine-id (``machine-id``): each host a machine of its own
    <root>/etc/                         sshd_config, host key, authorized_keys, machine-id
    <root>/log/sshd.log                 sshd's log (LogLevel VERBOSE); machine-id.reads: a line per read
    <root>/home/                        HOME of every session on the host
    <root>/knobs.json                   speed and fault knobs read by the simulated tools
    <root>/gpus/<pid>.json              GPU users, as nvidia-smi lists them
    <root>/sglang/                      git clone of the simulated upstream SGLang (origin, main)
    <root>/venv/bin/python              a venv whose .pth puts <root>/sglang/python on sys.path, with a
                                        simulated torch (hosttools/torch_stub: doctor --nccl's all-reduce)
                                        and flashinfer (hosttools/flashinfer_stub: its __version__)
    <root>/venv/bin/sglang              SGLang's console script (``sglang serve ...``), as pip installs it
    <root>/models/DeepSeek-V4-Flash/    config.json of the model, its shard index and (tiny) shards
    <root>/orch/                        orch's workdir (not created here: orch creates it)
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from orchestrator.sandbox import gitrepo, modelconfig
from orchestrator.sandbox.hosttools import df, flashinfer_stub, kernel_log, mkdir, nvidia_smi, torch_stub

PTH_NAME = "sglang_sim_editable.pth"
CONSOLE_SCRIPTS = {"sglang": "sglang.cli.main:main"}
"""The ``[project.scripts]`` of the simulated SGLang's ``pyproject.toml`` (a sandbox test compares them)."""

_CONSOLE_SCRIPT = """{shebang}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


@dataclass(frozen=True)
class HostDisk:
    """Where everything of one host lives (paths only; ``prepare`` creates them)."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def knobs(self) -> Path:
        return self.root / "knobs.json"

    @property
    def gpus(self) -> Path:
        return self.root / "gpus"

    @property
    def sglang_dir(self) -> Path:
        return self.root / "sglang"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model_path(self) -> Path:
        return self.root / "models" / modelconfig.MODEL_NAME

    @property
    def workdir(self) -> Path:
        return self.root / "orch"

    def session_env(self) -> dict[str, str]:
        """The environment of every command on the host: its ``bin`` first on PATH, its HOME, its root."""
        return {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "ORCH_SIM_HOST": str(self.root),
            "HOME": str(self.home),
        }


def prepare(disk: HostDisk, upstream: Path, venv_template: Path, knobs: Mapping[str, object]) -> None:
    """Create the host's disk: tools, checkout, interpreter, model, knobs."""
    for directory in (disk.bin, disk.etc, disk.home, disk.gpus, disk.root / "log"):
        directory.mkdir(parents=True, exist_ok=True)
    install_tools(disk.bin)
    install_machine_id(disk)
    gitrepo.clone(upstream, disk.sglang_dir)
    install_venv(venv_template, disk.venv, disk.sglang_dir / "python")
    modelconfig.write_model(disk.model_path.parent)
    merge_knobs(disk.knobs, knobs)


def install_machine_id(disk: HostDisk) -> None:
    """The host's own ``etc/machine-id`` (random, as systemd makes it on first boot) and the
    ``systemd-id128`` that prints it: orch reads a host's machine-id with ``systemd-id128 machine-id``
    (``facts.machine``), and the sim's hosts share the controller's ``/etc``."""
    (disk.etc / "machine-id").write_text(uuid.uuid4().hex + "\n")
    (disk.bin / "systemd-id128").write_text(_SYSTEMD_ID128)
    (disk.bin / "systemd-id128").chmod(0o755)


_SYSTEMD_ID128 = """#!/bin/sh
# The simulated host's systemd-id128 (install_machine_id): `machine-id` prints this host's etc/machine-id.
root=${ORCH_SIM_HOST:-$(dirname "$0")/..}
[ "$1" = machine-id ] && echo read >>"$root/log/machine-id.reads" && exec cat "$root/etc/machine-id"
echo "systemd-id128: only 'machine-id' is simulated" >&2
exit 1
"""


def install_tools(bin_dir: Path) -> None:
    """The simulated host's programs (``hosttools``) into its ``bin_dir``."""
    install_tool(nvidia_smi, bin_dir / "nvidia-smi")
    install_tool(kernel_log, bin_dir / "dmesg")
    install_tool(kernel_log, bin_dir / "journalctl")
    install_tool(df, bin_dir / "df", real=df.REAL, knobs=df.KNOBS)
    install_tool(mkdir, bin_dir / "mkdir", real=mkdir.REAL, knobs=mkdir.KNOBS)


def install_tool(module: ModuleType, dest: Path, *, real: str | None = None, knobs: Sequence[str] = ()) -> None:
    """``module`` as the host's program ``dest``: copied to ``<root>/lib`` and run from there by this interpreter
    without site-packages (it needs only the standard library), imported, so that it is compiled once per host,
    not on every call (orch calls these on every host many times a test). ``real``: the module is the real
    program ``real`` but for ``knobs``; ``dest`` is then a shell script that runs ``real`` itself while the
    host's ``knobs.json`` names none of them (no Python start-up at all) and the module when it names one."""
    lib = dest.parent.parent / "lib"
    lib.mkdir(exist_ok=True)
    name = module.__name__.rpartition(".")[2]
    shutil.copyfile(str(module.__file__), lib / f"{name}.py")
    program = dest if real is None else lib / dest.name
    program.write_text(_IMPORTER.format(python=sys.executable, lib=str(lib), module=name))
    program.chmod(0o755)
    if real is not None:
        dest.write_text(_KNOB_GATE.format(real=real, knobs="|".join(knobs), program=shlex.quote(str(program))))
        dest.chmod(0o755)


_IMPORTER = """#!{python} -SI
import sys
sys.path.insert(0, {lib!r})
from {module} import main
sys.exit(main(sys.argv[1:]))
"""

_KNOB_GATE = """#!/bin/sh
# The simulated host's {real}: the real one unless the host's knobs.json names {knobs}; then the simulator.
grep -qsE '"({knobs})"' "${{ORCH_SIM_HOST:-${{0%/*}}/..}}/knobs.json" || exec {real} "$@"
exec {program} "$@"
"""


def make_venv_template(path: Path) -> Path:
    """One real venv (no pip, system site-packages) that hosts copy: cheaper than one ``venv`` per host."""
    argv = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)]
    subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return path


def install_venv(template: Path, dest: Path, source_dir: Path) -> None:
    """Copy the venv template to ``dest`` and make ``source_dir`` importable with its console scripts
    in ``dest/bin`` (as ``pip install -e`` does)."""
    shutil.copytree(template, dest, symlinks=True)
    point_editable(dest, source_dir)
    site = dest / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    shutil.copytree(Path(torch_stub.__file__).parent, site / "torch", ignore=shutil.ignore_patterns("__pycache__"))
    stub = Path(flashinfer_stub.__file__).parent
    shutil.copytree(stub, site / "flashinfer", ignore=shutil.ignore_patterns("__pycache__"))
    for name, entry in CONSOLE_SCRIPTS.items():
        install_console_script(dest / "bin" / name, dest / "bin" / "python", entry)


def point_editable(venv: Path, source_dir: Path) -> None:
    """Make the venv import its packages from ``source_dir`` (the ``.pth`` an editable install writes)."""
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (site / PTH_NAME).write_text(f"{source_dir}\n")


def console_script_shebang(python: Path) -> str:
    """The interpreter line(s) pip (distlib's ``ScriptMaker._build_shebang``) writes for ``python``:
    ``#!python`` when the path has no space and the line fits in 127 bytes; else a ``/bin/sh``
    trampoline, the path in double quotes when it has a space, so /bin/sh expands ``$``, backticks and
    backslashes in it when the script starts, as on a real host."""
    executable = str(python)
    if " " not in executable and len(executable.encode()) + 3 <= 127:
        return f"#!{executable}"
    quoted = f'"{executable}"' if " " in executable else executable
    return "#!/bin/sh\n'''exec' " + quoted + ' "$0" "$@"\n' + "' '''"


def install_console_script(path: Path, python: Path, entry: str) -> None:
    """Write the script pip makes for ``name = "module:function"``, run by ``python``."""
    module, function = entry.split(":")
    shebang = console_script_shebang(python)
    path.write_text(_CONSOLE_SCRIPT.format(shebang=shebang, module=module, function=function))
    path.chmod(0o755)


def read_knobs(path: Path) -> dict[str, object]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def merge_knobs(path: Path, knobs: Mapping[str, object]) -> None:
    """Merge ``knobs`` into the knobs file atomically (a tool starting meanwhile sees old or new).

    A knob set to None is removed: the tools use its default again.
    """
    merged = {name: value for name, value in {**read_knobs(path), **knobs}.items() if value is not None}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
