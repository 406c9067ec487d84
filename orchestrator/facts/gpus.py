"""nvidia-smi's scripting interface: argv builders and CSV parsers (reference §4)."""

from __future__ import annotations

from dataclasses import dataclass

GPU_FIELDS = ("index", "name", "uuid", "memory.total", "memory.used", "utilization.gpu", "compute_cap")
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "used_memory")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int | None
    compute_cap: str


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    process_name: str
    gpu_uuid: str
    used_memory_mib: int | None


class NvidiaSmiError(Exception):
    pass


def query_gpus_argv() -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]


def query_apps_argv() -> list[str]:
    return ["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"]


def _rows(stdout: str, width: int) -> list[list[str]]:
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != width:
            raise NvidiaSmiError(f"unexpected nvidia-smi line: {line!r}")
        rows.append(cells)
    return rows


def _int(value: str) -> int | None:
    """nvidia-smi prints ``[N/A]`` or ``[Not Supported]`` where it has no number."""
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_gpus(stdout: str) -> list[Gpu]:
    gpus = []
    for idx, name, uuid, total, used, util, cap in _rows(stdout, len(GPU_FIELDS)):
        gpus.append(Gpu(int(idx), name, uuid, _int(total) or 0, _int(used) or 0, _int(util), cap))
    return gpus


def parse_apps(stdout: str) -> list[GpuProcess]:
    if "No running processes found" in stdout:
        return []
    return [GpuProcess(int(pid), name, uuid, _int(mem)) for pid, name, uuid, mem in _rows(stdout, len(APP_FIELDS))]


def device_file_name(gpu_name: str) -> str:
    """The device part of a tuned config's file name: ``torch.cuda.get_device_name()`` with spaces → ``_``."""
    return gpu_name.replace(" ", "_")
