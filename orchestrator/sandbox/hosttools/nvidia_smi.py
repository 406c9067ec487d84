#!/usr/bin/env python3
"""Simulated ``nvidia-smi`` of a sandbox host (installed as ``<root>/bin/nvidia-smi``).

The GPUs come from the host's knobs (``<root>/knobs.json``: ``gpus``, ``gpu_name``); their users are
the registrations in ``<root>/gpus/<pid>.json`` (``{"pid", "name", "gpus", "memory_mib"}``, optional
``start_time`` and ``utilization``) that the simulated tools write while they run. A registration
whose process is gone (or a zombie, or a reused pid) is ignored, as the driver frees a dead
process's memory. The host root is ``$ORCH_SIM_HOST``, else the parent of this file's directory.

Forms answered (``docs/reference/sglang.md`` section 4): ``--query-gpu=FIELDS``,
``--query-compute-apps=FIELDS``, ``--format=csv[,noheader][,nounits]``, ``-i INDEX``, ``-L``, ``-q``
(the real layout, abridged to the sections ``orch doctor`` reads) and a plain table. Knob ``gpu_faults``
(fault name -> GPU index) makes ``-q`` report a sick GPU: ``FAULTS`` lists the names; knobs
``driver_version`` and ``cuda_version`` change the versions it reports.
Knob ``nvidia_smi_fail`` makes it fail like a host whose driver is gone (exit 9);
knob ``nvidia_smi_hang`` makes it hang like one whose driver is wedged (it sleeps until killed).

orch calls it on every host many times a test (``orch status``, health and tuning waits), so it imports
only what it needs at run time: no ``dataclasses``, ``pathlib``, ``typing`` or ``hashlib`` (over half of its
start-up was their import); ``hostdisk.install_tool`` runs it as an imported module, compiled once per host.
"""

from __future__ import annotations

import binascii
import json
import os
import sys
import time

TYPE_CHECKING = False  # typing's flag, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import TypeVar

    Root = str | os.PathLike[str]
    Row = TypeVar("Row")

DEFAULT_GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TOTAL_MIB = 97887
DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"
DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


class Gpu:
    __slots__ = ("index", "memory_total", "memory_used", "name", "utilization", "uuid")

    def __init__(self, index: int, name: str, uuid: str, memory_total: int, memory_used: int, utilization: int):
        self.index, self.name, self.uuid = index, name, uuid
        self.memory_total, self.memory_used, self.utilization = memory_total, memory_used, utilization

    @property
    def bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"


class GpuProcess:
    """One line of ``--query-compute-apps``: a process on one GPU."""

    __slots__ = ("gpu_index", "gpu_name", "gpu_uuid", "pid", "process_name", "used_memory")

    def __init__(self, pid: int, process_name: str, gpu_index: int, gpu_uuid: str, gpu_name: str, used_memory: int):
        self.pid, self.process_name, self.used_memory = pid, process_name, used_memory
        self.gpu_index, self.gpu_uuid, self.gpu_name = gpu_index, gpu_uuid, gpu_name


def host_root() -> str:
    return os.environ.get("ORCH_SIM_HOST") or os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def load_knobs(root: Root) -> dict[str, object]:
    try:
        data = json.loads(_read(os.path.join(root, "knobs.json")))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def gpu_uuid(root: Root, index: int) -> str:
    """A UUID stable for a host (its root path) and GPU index (CRC-32s: ``hashlib`` loads OpenSSL, a fifth
    of this program's start-up)."""
    digest = "".join(f"{binascii.crc32(f'{part}:{root}:{index}'.encode()):08x}" for part in range(4))
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process; None when it is gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def live_registrations(root: Root) -> list[dict[str, object]]:
    """Registrations whose process still runs (and is the same process: start time matches)."""
    entries, directory = [], os.path.join(root, "gpus")
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    for name in names:
        try:
            entry = json.loads(_read(os.path.join(directory, name)))
        except (OSError, ValueError):
            continue
        started = process_start_time(int(entry["pid"]))
        if started is not None and entry.get("start_time", started) == started:
            entries.append(entry)
    return entries


def gpu_processes(root: Root) -> list[GpuProcess]:
    """What ``--query-compute-apps`` lists: one row per (process, GPU) in use."""
    by_index = {gpu.index: gpu for gpu in _bare_gpus(root)}
    return [row for entry in live_registrations(root) for row in _process_rows(entry, by_index)]


def _process_rows(entry: dict[str, object], by_index: dict[int, Gpu]) -> list[GpuProcess]:
    pid, name, memory = int(str(entry["pid"])), str(entry.get("name", "python")), int(str(entry.get("memory_mib", 0)))
    gpus_used = [by_index[i] for i in _ints(entry.get("gpus")) if i in by_index]
    return [GpuProcess(pid, name, gpu.index, gpu.uuid, gpu.name, memory) for gpu in gpus_used]


def gpus(root: Root) -> list[Gpu]:
    """Every GPU of the host with its memory use and utilization from the live registrations."""
    result = []
    entries = live_registrations(root)
    for gpu in _bare_gpus(root):
        users = [e for e in entries if gpu.index in _ints(e.get("gpus"))]
        used = sum(int(str(e.get("memory_mib", 0))) for e in users)
        busy = max((int(str(e.get("utilization", 0))) for e in users), default=0)
        result.append(Gpu(gpu.index, gpu.name, gpu.uuid, TOTAL_MIB, min(used, TOTAL_MIB), min(busy, 100)))
    return result


def _bare_gpus(root: Root) -> list[Gpu]:
    knobs = load_knobs(root)
    count = int(str(knobs.get("gpus", 8)))
    name = str(knobs.get("gpu_name", DEFAULT_GPU_NAME))
    return [Gpu(i, name, gpu_uuid(root, i), TOTAL_MIB, 0, 0) for i in range(count)]


def _ints(value: object) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list) else []


# --- formatting -------------------------------------------------------------------------------

GPU_FIELDS: dict[str, tuple[str, str, Callable[[Gpu], object]]] = {
    "index": ("index", "", lambda g: g.index),
    "name": ("name", "", lambda g: g.name),
    "gpu_name": ("name", "", lambda g: g.name),
    "uuid": ("uuid", "", lambda g: g.uuid),
    "gpu_uuid": ("uuid", "", lambda g: g.uuid),
    "pci.bus_id": ("pci.bus_id", "", lambda g: g.bus_id),
    "memory.total": ("memory.total", "MiB", lambda g: g.memory_total),
    "memory.used": ("memory.used", "MiB", lambda g: g.memory_used),
    "memory.free": ("memory.free", "MiB", lambda g: g.memory_total - g.memory_used),
    "utilization.gpu": ("utilization.gpu", "%", lambda g: g.utilization),
    "utilization.memory": ("utilization.memory", "%", lambda g: g.utilization // 2),
    "compute_cap": ("compute_cap", "", lambda g: "12.0"),
    "driver_version": ("driver_version", "", lambda g: DRIVER_VERSION),
    "count": ("count", "", lambda g: g.index + 1),
    "temperature.gpu": ("temperature.gpu", "", lambda g: 32 + g.utilization // 3),
}

APP_FIELDS: dict[str, tuple[str, str, Callable[[GpuProcess], object]]] = {
    "pid": ("pid", "", lambda p: p.pid),
    "process_name": ("process_name", "", lambda p: p.process_name),
    "name": ("process_name", "", lambda p: p.process_name),
    "gpu_uuid": ("gpu_uuid", "", lambda p: p.gpu_uuid),
    "gpu_name": ("gpu_name", "", lambda p: p.gpu_name),
    "gpu_bus_id": ("gpu_bus_id", "", lambda p: f"00000000:{0x18 + 0x10 * p.gpu_index:02X}:00.0"),
    "used_memory": ("used_gpu_memory", "MiB", lambda p: p.used_memory),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda p: p.used_memory),
}


class UsageFailure(Exception):
    """Bad command line: the message is what nvidia-smi prints."""


def format_csv(
    rows: Sequence[Row],
    fields: Sequence[str],
    table: Mapping[str, tuple[str, str, Callable[[Row], object]]],
    options: Sequence[str],
) -> str:
    """Rows as nvidia-smi's CSV: ``", "``-separated, header and units unless turned off."""
    for field in fields:
        if field not in table:
            raise UsageFailure(f'Field "{field}" is not a valid field to query.\n')
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(_header(*table[f][:2]) for f in fields))
    for row in rows:
        lines.append(", ".join(_value(table[f][2](row), table[f][1], options) for f in fields))
    return "".join(line + "\n" for line in lines)


def _header(name: str, unit: str) -> str:
    return f"{name} [{unit}]" if unit else name


def _value(value: object, unit: str, options: Sequence[str]) -> str:
    return f"{value} {unit}" if unit and "nounits" not in options else str(value)


def format_list(gpu_list: Sequence[Gpu]) -> str:
    return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpu_list)


def format_table(gpu_list: Sequence[Gpu], apps: Sequence[GpuProcess]) -> str:
    """A rough copy of the default human table."""
    bar = "+" + "-" * 89 + "+"
    lines = [
        bar,
        f"| NVIDIA-SMI {DRIVER_VERSION}   Driver Version: {DRIVER_VERSION}   CUDA Version: 13.0".ljust(90) + "|",
        bar,
    ]
    for g in gpu_list:
        lines.append(
            f"| {g.index:>3}  {g.name[:44]:<44} {g.memory_used:>6}MiB / {g.memory_total}MiB {g.utilization:>4}% |"
        )
    lines += [bar, "| Processes:".ljust(90) + "|", "|  GPU   PID   Process name   GPU Memory Usage".ljust(90) + "|"]
    lines += [f"| {p.gpu_index:>4} {p.pid:>7}   {p.process_name[:40]:<40} {p.used_memory:>8}MiB |" for p in apps]
    if not apps:
        lines.append("|  No running processes found".ljust(90) + "|")
    return "\n".join([*lines, bar]) + "\n"


# --- nvidia-smi -q ----------------------------------------------------------------------------

FAULTS = (
    "persistence_off",  # Persistence Mode: Disabled
    "ecc_uncorrectable",  # ECC Errors / Volatile / DRAM Uncorrectable: 2
    "retired_pages",  # Retired Pages / Double Bit ECC: 3, Pending Page Blacklist: Yes
    "row_remap_failure",  # Remapped Rows / Remapping Failure Occurred: Yes
    "row_remap_pending",  # Remapped Rows / Pending: Yes
    "hw_slowdown",  # Clocks Event Reasons / HW Slowdown, HW Thermal Slowdown: Active
    "sw_thermal",  # Clocks Event Reasons / SW Thermal Slowdown: Active
    "pcie_x4",  # GPU Link Info / Link Width / Current: 4x (Max 16x)
)


def format_query(gpu_list: Sequence[Gpu], knobs: Mapping[str, object]) -> str:
    """``nvidia-smi -q`` in the real layout (driver 580), with the knobs' faults on their GPUs."""
    faults = knobs.get("gpu_faults")
    sick = {str(k): int(str(v)) for k, v in faults.items()} if isinstance(faults, dict) else {}
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        _kv(0, "Driver Version", knobs.get("driver_version", DRIVER_VERSION)),
        _kv(0, "CUDA Version", knobs.get("cuda_version", CUDA_VERSION)),
        "",
        _kv(0, "Attached GPUs", len(gpu_list)),
    ]
    for gpu in gpu_list:
        lines += _gpu_block(gpu, {name for name, index in sick.items() if index == gpu.index})
    return "\n".join(lines) + "\n\n"


def _kv(depth: int, key: str, value: object) -> str:
    return f"{' ' * 4 * depth}{key}".ljust(42) + f": {value}"


def _head(depth: int, name: str) -> str:
    return f"{' ' * 4 * depth}{name}"


def _active(on: bool) -> str:
    return "Active" if on else "Not Active"


def _gpu_block(gpu: Gpu, faults: set[str]) -> list[str]:
    uncorrectable = 2 if "ecc_uncorrectable" in faults else 0
    slow, thermal = "hw_slowdown" in faults, "sw_thermal" in faults
    return [
        f"GPU {gpu.bus_id}",
        _kv(1, "Product Name", gpu.name),
        _kv(1, "Product Architecture", "Blackwell"),
        _kv(1, "Persistence Mode", "Disabled" if "persistence_off" in faults else "Enabled"),
        _kv(1, "GPU UUID", gpu.uuid),
        _kv(1, "Minor Number", gpu.index),
        _head(1, "PCI"),
        _kv(2, "Bus Id", gpu.bus_id),
        _head(2, "GPU Link Info"),
        _head(3, "PCIe Generation"),
        _kv(4, "Max", 5),
        _kv(4, "Current", 1 if gpu.utilization == 0 else 5),
        _kv(4, "Device Current", 1 if gpu.utilization == 0 else 5),
        _kv(4, "Device Max", 5),
        _kv(4, "Host Max", 5),
        _head(3, "Link Width"),
        _kv(4, "Max", "16x"),
        _kv(4, "Current", "4x" if "pcie_x4" in faults else "16x"),
        _kv(2, "Replays Since Reset", 0),
        _kv(1, "Performance State", "P8" if gpu.utilization == 0 else "P0"),
        _head(1, "Clocks Event Reasons"),
        _kv(2, "Idle", _active(gpu.utilization == 0)),
        _kv(2, "Applications Clocks Setting", _active(False)),
        _kv(2, "SW Power Cap", _active(False)),
        _kv(2, "HW Slowdown", _active(slow)),
        _kv(3, "HW Thermal Slowdown", _active(slow)),
        _kv(3, "HW Power Brake Slowdown", _active(False)),
        _kv(2, "Sync Boost", _active(False)),
        _kv(2, "SW Thermal Slowdown", _active(thermal)),
        _kv(2, "Display Clock Setting", _active(False)),
        _head(1, "FB Memory Usage"),
        _kv(2, "Total", f"{gpu.memory_total} MiB"),
        _kv(2, "Used", f"{gpu.memory_used} MiB"),
        _kv(2, "Free", f"{gpu.memory_total - gpu.memory_used} MiB"),
        _head(1, "Utilization"),
        _kv(2, "Gpu", f"{gpu.utilization} %"),
        _head(1, "ECC Mode"),
        _kv(2, "Current", "Enabled"),
        _kv(2, "Pending", "Enabled"),
        _head(1, "ECC Errors"),
        _head(2, "Volatile"),
        _kv(3, "SRAM Correctable", 0),
        _kv(3, "SRAM Uncorrectable Parity", 0),
        _kv(3, "SRAM Uncorrectable SEC-DED", 0),
        _kv(3, "DRAM Correctable", 0),
        _kv(3, "DRAM Uncorrectable", uncorrectable),
        _head(2, "Aggregate"),
        _kv(3, "SRAM Correctable", 0),
        _kv(3, "SRAM Uncorrectable Parity", 0),
        _kv(3, "SRAM Uncorrectable SEC-DED", 0),
        _kv(3, "DRAM Correctable", 0),
        _kv(3, "DRAM Uncorrectable", uncorrectable),
        _head(1, "Retired Pages"),
        _kv(2, "Single Bit ECC", "N/A"),
        _kv(2, "Double Bit ECC", 3 if "retired_pages" in faults else "N/A"),
        _kv(2, "Pending Page Blacklist", "Yes" if "retired_pages" in faults else "N/A"),
        _head(1, "Remapped Rows"),
        _kv(2, "Correctable Error", 0),
        _kv(2, "Uncorrectable Error", 0),
        _kv(2, "Pending", "Yes" if "row_remap_pending" in faults else "No"),
        _kv(2, "Remapping Failure Occurred", "Yes" if "row_remap_failure" in faults else "No"),
        _head(2, "Bank Remap Availability Histogram"),
        _kv(3, "Max", "1536 bank(s)"),
        _kv(3, "High", "0 bank(s)"),
        _head(1, "Temperature"),
        _kv(2, "GPU Current Temp", f"{(95 if thermal else 32 + gpu.utilization // 3)} C"),
        _kv(1, "Processes", "None"),
        "",
    ]


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    """``--opt=value`` / ``--opt value`` / ``-i N`` / ``-L`` into a dict of option → value."""
    options: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("-L", "--list-gpus", "-h", "--help"):
            options[name.lstrip("-")[:1].upper()] = ""
        elif name in ("-q", "--query"):
            options["Q"] = ""
        elif name in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            if not eq and not args:
                raise UsageFailure(INVALID_ARGS)
            options[name] = value if eq else args.pop(0)
        else:
            raise UsageFailure(INVALID_ARGS)
    return options


def render(root: Root, options: dict[str, str]) -> str:
    """The text nvidia-smi prints for parsed ``options``."""
    gpu_list = gpus(root)
    selected = options.get("-i", options.get("--id"))
    if selected is not None:
        gpu_list = [g for g in gpu_list if str(g.index) in selected.split(",")]
    fmt = options.get("--format", "").split(",")
    if "--query-gpu" in options:
        return format_csv(gpu_list, _fields(options["--query-gpu"]), GPU_FIELDS, _csv_options(fmt))
    if "--query-compute-apps" in options:
        apps = [p for p in gpu_processes(root) if p.gpu_index in {g.index for g in gpu_list}]
        return format_csv(apps, _fields(options["--query-compute-apps"]), APP_FIELDS, _csv_options(fmt))
    if "L" in options:
        return format_list(gpu_list)
    if "Q" in options:
        return format_query(gpu_list, load_knobs(root))
    return format_table(gpu_list, gpu_processes(root))


def _fields(spec: str) -> list[str]:
    return [f.strip() for f in spec.split(",") if f.strip()]


def _csv_options(fmt: list[str]) -> list[str]:
    if "csv" not in fmt:
        raise UsageFailure('"--format" requires "csv": use --format=csv[,noheader][,nounits]')
    return fmt


def main(argv: Sequence[str]) -> int:
    root = host_root()
    knobs = load_knobs(root)
    while knobs.get("nvidia_smi_hang"):  # a wedged driver: no answer, ever
        time.sleep(3600)
    if knobs.get("nvidia_smi_fail"):
        print(DRIVER_FAILURE)
        return 9
    try:
        options = parse_args(argv)
        if "H" in options:
            print(
                "NVIDIA System Management Interface (simulated). Forms: --query-gpu=, "
                "--query-compute-apps=, --format=csv[,noheader][,nounits], -i, -L"
            )
            return 0
        sys.stdout.write(render(root, options))
    except UsageFailure as failure:
        print(failure)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
