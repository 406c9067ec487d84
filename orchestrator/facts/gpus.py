"""nvidia-smi's scripting interface: argv builders and CSV parsers (reference §4), and the one busy-GPU
policy: who of a GPU's holders is foreign (``foreign_holders``) and how a refusal names them
(``busy_message``), for ``serve`` and ``tune-fp8`` alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import HostOutputError, RemoteCommandError
from orchestrator.facts.probe import TIMED_OUT
from orchestrator.text import fmt_ranges
from orchestrator.transport.base import CommandResult, check_result

GPU_FIELDS = ("index", "name", "uuid", "memory.total", "memory.used", "utilization.gpu", "compute_cap")
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "used_memory")

GPU_QUERY_TIMEOUT = 20  # seconds a query may take on the host; a wedged driver makes nvidia-smi hang
_KILL_AFTER = 5  # then SIGKILL, if it ignored the SIGTERM
CLIENT_TIMEOUT = GPU_QUERY_TIMEOUT + _KILL_AFTER + 10
"""What the caller waits for the remote command: a backstop, the host-side ``timeout`` ends it first."""
HANG_MESSAGE = f"did not answer in {GPU_QUERY_TIMEOUT} s (a wedged driver?)"


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


@dataclass(frozen=True)
class Holder:
    """A process on GPU ``gpu``: ``job`` names the orch job it belongs to (None: orch did not start it,
    or, for ``tune-fp8``'s holders from its discovery, nobody asked)."""

    gpu: int
    pid: int
    name: str
    job: str | None = None


class NvidiaSmiError(HostOutputError):
    """nvidia-smi answered something that is not its CSV (the message names the line and field)."""


def _bounded(argv: list[str]) -> list[str]:
    """``argv`` ended on the host after ``GPU_QUERY_TIMEOUT`` s, so a hung nvidia-smi does not stay behind."""
    return ["timeout", "-k", str(_KILL_AFTER), str(GPU_QUERY_TIMEOUT), *argv]


def query_gpus_argv() -> list[str]:
    return _bounded(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"])


def query_apps_argv() -> list[str]:
    return _bounded(["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])


def timed_out(exit_status: int) -> bool:
    """Whether a query's exit status says the host-side ``timeout`` ended it."""
    return exit_status in TIMED_OUT


def answer(host: str, result: CommandResult) -> str:
    """A query's output; ``RemoteCommandError`` naming the host when it failed or hung."""
    if timed_out(result.exit_status):
        raise RemoteCommandError(f"{host}: nvidia-smi {HANG_MESSAGE}", exit_status=result.exit_status)
    return check_result(host, result).stdout


def _shown(text: str) -> str:
    return repr(text[:120] + "…" if len(text) > 120 else text)


def _rows(stdout: str, width: int, what: str) -> list[list[str]]:
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != width:
            raise NvidiaSmiError(
                f"nvidia-smi answered a line that is not {what} ({len(cells)} fields, expected {width}): {_shown(line)}"
            )
        rows.append(cells)
    return rows


def _int(value: str) -> int | None:
    """nvidia-smi prints ``[N/A]`` or ``[Not Supported]`` where it has no number."""
    try:
        return int(float(value))
    except (ValueError, OverflowError):
        return None


def _count(cells: list[str], field: int, what: str) -> int:
    """Field ``field`` (1-based) of a row, which must be a whole number ≥ 0 (a GPU index, a pid)."""
    value = cells[field - 1]
    if not (value.isascii() and value.isdigit()):
        raise NvidiaSmiError(
            f"nvidia-smi answered a line that is not {what} (field {field} {_shown(value)} is not a number): "
            f"{_shown(', '.join(cells))}"
        )
    return int(value)


def parse_gpus(stdout: str) -> list[Gpu]:
    gpus = []
    for row in _rows(stdout, len(GPU_FIELDS), "a GPU"):
        _, name, uuid, total, used, util, cap = row
        gpus.append(Gpu(_count(row, 1, "a GPU"), name, uuid, _int(total) or 0, _int(used) or 0, _int(util), cap))
    return gpus


def parse_apps(stdout: str) -> list[GpuProcess]:
    if "No running processes found" in stdout:
        return []
    what = "a GPU process"
    return [
        GpuProcess(_count(row, 1, what), row[1], row[2], _int(row[3])) for row in _rows(stdout, len(APP_FIELDS), what)
    ]


def holders(devices: Sequence[Gpu], apps: Sequence[GpuProcess]) -> list[tuple[int, GpuProcess]]:
    """Each process holding one of ``devices``, with that GPU's index, in nvidia-smi's order: the one join
    of the two queries (by GPU UUID) that ``orch status``, ``serve`` and ``tune-fp8`` read holders by. A
    process on a GPU not in ``devices`` is not a holder."""
    index = {d.uuid: d.index for d in devices}
    return [(index[a.gpu_uuid], a) for a in apps if a.gpu_uuid in index]


def holders_by_gpu(devices: Sequence[Gpu], apps: Sequence[GpuProcess]) -> dict[int, list[GpuProcess]]:
    """``holders`` per GPU index, every GPU of ``devices`` present (an idle one: ``[]``)."""
    held = holders(devices, apps)
    return {d.index: [a for i, a in held if i == d.index] for d in devices}


def foreign_holders(holders: Sequence[Holder], ours: str | None = None) -> list[Holder]:
    """The one busy-GPU policy: who of ``holders`` is not ours. ``ours`` is the orch job a command is
    about to replace (``serve``: the old server, which it stops itself); without one (``tune-fp8``, whose
    jobs start only on free GPUs) every holder is foreign. Each command keeps its own way out
    (``--stop-server``, ``--allow-busy-gpus``)."""
    return [h for h in holders if ours is None or h.job != ours]


def busy_message(host: str, headline: str, holders: Sequence[Holder], *, owners: bool) -> str:
    """The one shape of a busy-GPU refusal: ``<host>: <headline>: GPU 0-7: pid p (name); ...``, the GPUs of
    one process in one group (as ``orch status`` shows them). ``owners``: the holders were tied to their
    orch jobs (``readers.read_gpu_info``), so each also says whose it is (``orch job <id>`` or ``not
    started by orch``)."""
    groups: dict[tuple[int, str, str | None], list[int]] = {}
    for h in holders:
        groups.setdefault((h.pid, h.name, h.job), []).append(h.gpu)
    return f"{host}: {headline}: " + "; ".join(_held(key, gpus, owners) for key, gpus in groups.items())


def _held(key: tuple[int, str, str | None], gpus: list[int], owners: bool) -> str:
    pid, name, job = key
    owner = (f", orch job {job}" if job else ", not started by orch") if owners else ""
    return f"GPU {fmt_ranges(gpus)}: pid {pid} ({name}{owner})"


def device_file_name(gpu_name: str) -> str:
    """The device part of a tuned config's file name: ``torch.cuda.get_device_name()`` with spaces → ``_``."""
    return gpu_name.replace(" ", "_")
