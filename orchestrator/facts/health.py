"""``orch doctor``'s checks: the commands of one round trip and pure parsers of what they print.

``sections(host)`` is what doctor asks a host in one probe (``facts.probe``): ``nvidia-smi -q`` (the
GPUs' health: persistence mode, ECC errors, retired pages, remapped rows, clock event reasons, PCIe
link), the kernel log's Xid lines, ``df`` where orch writes, the model directory and its shard index,
and where the host's Python finds ``sglang``. Each ``check_*`` turns one section into ``Finding``s:
``fail`` (the host is not to be trusted with a campaign), ``warn`` (worth a look, the host still works)
or ``note`` (something doctor could not check, said so, changing nothing). ``fleet_findings`` compares
driver, CUDA and GPU model across the hosts checked together: an outlier is a warning.

The ``nvidia-smi -q`` layout is the real one (key ``: `` value lines, sections by 4-space indent, one
block per GPU from ``GPU 00000000:18:00.0``); drivers before 535 say ``Clocks Throttle Reasons`` where
newer ones say ``Clocks Event Reasons``, and both are read.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from orchestrator.facts import replacement
from orchestrator.facts.gpus import GPU_QUERY_TIMEOUT
from orchestrator.facts.probe import Section

Severity = Literal["fail", "warn", "note"]
GIB = 1 << 30
DISK_FLOOR = 1 * GIB  # below this a filesystem fails: logs, configs and caches cannot be written
DISK_MARGIN = 20 * GIB  # below this (or a tenth of the model, if more) a filesystem warns
CACHE_DIR = "~/.cache"  # where SGLang's JIT caches (Triton, FlashInfer, torch compile) go
FATAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    64: "row remapping failed",
    74: "NVLink error",
    79: "GPU fell off the bus",
    92: "high single-bit ECC rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Xid codes that say the hardware is sick (NVIDIA's Xid catalog); any other Xid is a warning (most
are an application's fault: 13, 31, 43)."""


@dataclass(frozen=True)
class Finding:
    severity: Severity
    text: str


# --- the round trip --------------------------------------------------------------------------------

# A kernel log since boot is never empty: an empty answer is a log this user may not see (journalctl
# without the adm/systemd-journal group shows the user's own entries only, and exits 0).
_KERNEL_LOG = r"""
if { log=$(dmesg 2>/dev/null) && [ -n "$log" ]; } ||
   { log=$(journalctl -k -b -q --no-pager 2>/dev/null) && [ -n "$log" ]; }; then
  printf '%s\n' "$log" | grep -F 'NVRM: Xid' | tail -n 100
  exit 0
fi
echo "neither dmesg nor journalctl -k can be read by this user"
exit 3
"""
_DISK = r"""
for p in "$@"; do
  case $p in "~/"*) p=$HOME/${p#"~/"};; esac
  q=$p
  while [ ! -e "$q" ] && [ "$q" != / ]; do q=$(dirname "$q"); done
  printf '%s\t' "$p"
  df -Pk "$q" | tail -n 1
done
"""

_SGLANG_ORIGIN = """
import importlib.util, json, os, sys
spec = importlib.util.find_spec("sglang")
print(json.dumps([os.path.realpath(spec.origin) if spec and spec.origin else None, os.path.realpath(sys.argv[1])]))
"""
"""Prints, as one JSON line (a path may hold any character), where ``sglang`` would be imported from
(``find_spec``: the package is located, not run) and the checkout's real path."""

INDEX_NAME = "model.safetensors.index.json"


def sections(sglang_dir: str, python: str, model_path: str, workdir: str) -> list[tuple[str, list[str]]]:
    """What doctor runs on a host, all in one round trip (``probe.probe_argv``); read-only. The model
    directory is listed with links followed (a Hugging Face snapshot is links to blobs): only to read
    sizes, nothing is written through them."""
    bounded = ["timeout", "-k", "5", str(GPU_QUERY_TIMEOUT)]
    return [
        ("nvidia", [*bounded, "nvidia-smi", "-q"]),
        ("kernel", ["bash", "-c", _KERNEL_LOG]),
        ("disk", ["bash", "-c", _DISK, "orch-disk", workdir, model_path, CACHE_DIR, sglang_dir]),
        ("model_files", ["find", "-L", model_path, "-maxdepth", "1", "-mindepth", "1", "-printf", r"%s\t%y\t%f\n"]),
        ("model_index", ["cat", f"{model_path.rstrip('/')}/{INDEX_NAME}"]),
        ("python", [*bounded, python, "-c", _SGLANG_ORIGIN, sglang_dir]),
    ]


NET_SECTION = ("net", ["ls", "-1", "/sys/class/net"])
"""The host's network interfaces: asked of a replica group's rank, which names one to NCCL and Gloo."""


def check_interfaces(section: Section | None, name: str, interface_env: Mapping[str, str]) -> list[Finding]:
    """A rank whose group names a network interface the host lacks fails: its server would fail to start
    (``serve`` refuses it, nothing stopped); the check ``serve`` makes, said before any campaign."""
    fix = replacement.interface_fix(name)
    if section is None or not section.ok:
        return [Finding("fail", f"could not list the host's network interfaces (/sys/class/net): {fix}")]
    have = [line.strip() for line in section.output.splitlines() if line.strip()]
    what = replacement.missing_interface(have, interface_env)
    return [Finding("fail", f"{what}: its replica group's rank would fail to start; {fix}")] if what else []


# --- nvidia-smi -q ----------------------------------------------------------------------------------


@dataclass
class GpuReport:
    """One GPU's block of ``nvidia-smi -q``, as ``section/key`` → value (``ECC Errors/Volatile/DRAM
    Uncorrectable``)."""

    bus_id: str
    fields: dict[str, str] = field(default_factory=dict)

    def get(self, path: str) -> str | None:
        return self.fields.get(path)

    def under(self, prefix: str) -> dict[str, str]:
        """The fields below section ``prefix``, keyed by the rest of their path."""
        return {k[len(prefix) + 1 :]: v for k, v in self.fields.items() if k.startswith(prefix + "/")}


@dataclass
class SmiReport:
    driver: str | None
    cuda: str | None
    attached: int | None
    gpus: list[GpuReport]


_GPU_BLOCK = re.compile(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]\s*$")


def parse_query(text: str) -> SmiReport:
    """``nvidia-smi -q``'s text: the header's versions and each GPU's fields by indented path."""
    header: dict[str, str] = {}
    gpus: list[GpuReport] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if _GPU_BLOCK.match(line):
            gpus.append(GpuReport(line[4:].strip()))
            stack = []
            continue
        _read_line(line, gpus[-1].fields if gpus else header, stack)
    return SmiReport(
        header.get("Driver Version"), header.get("CUDA Version"), _number(header.get("Attached GPUs")), gpus
    )


def _read_line(line: str, into: dict[str, str], stack: list[tuple[int, str]]) -> None:
    if not line.strip() or line.startswith("="):
        return
    indent = len(line) - len(line.lstrip(" "))
    while stack and stack[-1][0] >= indent:
        stack.pop()
    key, colon, value = line.strip().partition(":")
    path = "/".join([*(name for _, name in stack), key.strip()])
    if colon and value.strip():
        into[path] = value.strip()
    else:
        stack.append((indent, key.strip()))


def _number(value: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match[1]) if match else None


def check_gpus(report: SmiReport, expected: int) -> list[Finding]:
    """The GPUs against the inventory's count, and each GPU's health."""
    found: list[Finding] = []
    count = len(report.gpus)
    if count < expected:
        found.append(Finding("fail", f"{count} GPUs, the inventory says {expected}"))
    elif count > expected:
        found.append(Finding("warn", f"{count} GPUs, the inventory says {expected} (the rest stay idle)"))
    names = sorted({g.get("Product Name") or "?" for g in report.gpus})
    if len(names) > 1:
        found.append(Finding("warn", f"mixed GPU models: {', '.join(names)}"))
    for index, gpu in enumerate(report.gpus):
        found += [Finding(f.severity, f"GPU {index}: {f.text}") for f in check_gpu(gpu)]
    return found


def check_gpu(gpu: GpuReport) -> list[Finding]:
    return [*_persistence(gpu), *_ecc(gpu), *_retired(gpu), *_remapped(gpu), *_clocks(gpu), *_pcie(gpu)]


def _persistence(gpu: GpuReport) -> list[Finding]:
    if gpu.get("Persistence Mode") == "Disabled":
        return [Finding("warn", "persistence mode off (each start re-initialises the GPU; `nvidia-smi -pm 1`)")]
    return []


def _ecc(gpu: GpuReport) -> list[Finding]:
    """Volatile (since the driver loaded) uncorrectable ECC errors: older drivers say ``Double Bit``."""
    volatile = gpu.under("ECC Errors/Volatile")
    bad = {k: n for k, v in volatile.items() if _uncorrectable(k) and (n := _number(v))}
    if not bad:
        return []
    return [Finding("fail", "uncorrectable ECC errors since boot: " + ", ".join(f"{k} {n}" for k, n in bad.items()))]


def _uncorrectable(key: str) -> bool:
    return "Uncorrectable" in key or key.startswith("Double Bit/Total") or key == "Double Bit"


def _retired(gpu: GpuReport) -> list[Finding]:
    found = []
    double = _number(gpu.get("Retired Pages/Double Bit ECC"))
    if double:
        found.append(Finding("warn", f"{double} memory pages retired for double-bit ECC errors"))
    if gpu.get("Retired Pages/Pending Page Blacklist") == "Yes" or gpu.get("Retired Pages/Pending") == "Yes":
        found.append(Finding("warn", "a page retirement is pending (takes effect at the next GPU reset)"))
    return found


def _remapped(gpu: GpuReport) -> list[Finding]:
    if gpu.get("Remapped Rows/Remapping Failure Occurred") == "Yes":
        return [Finding("fail", "row remapping failed (memory it cannot repair: a candidate for replacement)")]
    found = []
    if gpu.get("Remapped Rows/Pending") == "Yes":
        found.append(Finding("warn", "a row remapping is pending (takes effect at the next GPU reset)"))
    uncorrectable = _number(gpu.get("Remapped Rows/Uncorrectable Error"))
    if uncorrectable:
        found.append(Finding("warn", f"{uncorrectable} rows remapped for uncorrectable errors"))
    return found


_SLOWDOWNS: Mapping[str, Severity] = {
    "HW Slowdown": "fail",
    "HW Slowdown/HW Thermal Slowdown": "fail",
    "HW Slowdown/HW Power Brake Slowdown": "fail",
    "HW Thermal Slowdown": "fail",
    "HW Power Brake Slowdown": "fail",
    "SW Thermal Slowdown": "warn",
}


def _clocks(gpu: GpuReport) -> list[Finding]:
    """Hardware slowdowns (thermal, power brake) make every measurement on the host wrong: a failure."""
    reasons = gpu.under("Clocks Event Reasons") or gpu.under("Clocks Throttle Reasons")
    active = [k for k, v in reasons.items() if v == "Active" and k in _SLOWDOWNS]
    worst: Severity = "fail" if any(_SLOWDOWNS[k] == "fail" for k in active) else "warn"
    names = sorted({k.rsplit("/", 1)[-1] for k in active})
    return [Finding(worst, f"clocks slowed: {', '.join(names)}")] if active else []


def _pcie(gpu: GpuReport) -> list[Finding]:
    """A link trained narrower than the GPU's maximum is a failure (all-reduce over PCIe pays it on
    every layer); a lower generation only warns, and not at all while the GPU idles: an idle GPU drops
    its link speed to save power and raises it under load."""
    link = "PCI/GPU Link Info"
    found = []
    width, max_width = _number(gpu.get(f"{link}/Link Width/Current")), _number(gpu.get(f"{link}/Link Width/Max"))
    if width and max_width and width < max_width:
        found.append(Finding("fail", f"PCIe link x{width}, the GPU's maximum is x{max_width}"))
    gen, max_gen = _number(gpu.get(f"{link}/PCIe Generation/Current")), _number(gpu.get(f"{link}/PCIe Generation/Max"))
    idle = (gpu.get("Clocks Event Reasons/Idle") or gpu.get("Clocks Throttle Reasons/Idle")) == "Active"
    if gen and max_gen and gen < max_gen and not idle:
        found.append(Finding("warn", f"PCIe gen {gen} under load, the link's maximum is gen {max_gen}"))
    return found


# --- kernel log ---------------------------------------------------------------------------------------

_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d+)")


def check_kernel_log(section: Section | None, buses: Mapping[str, int] | None = None) -> list[Finding]:
    """Xid events in the kernel log since boot, each on the GPU whose PCI address it names (``buses``:
    ``bus_key`` → index, from ``nvidia-smi -q``); an unreadable log is said (a note), not a failure."""
    if section is None or not section.ok:
        why = section.output.strip().splitlines()[-1] if section and section.output.strip() else "no answer"
        return [Finding("note", f"Xid events not checked: {why}")]
    codes = Counter((int(m["code"]), m["where"]) for m in _XID.finditer(section.output))
    found = []
    for (code, where), times in sorted(codes.items()):
        severity: Severity = "fail" if code in FATAL_XIDS else "warn"
        what = f" ({FATAL_XIDS[code]})" if code in FATAL_XIDS else ""
        gpu = (buses or {}).get(bus_key(where))
        on = f"GPU {gpu}" if gpu is not None else where
        found.append(Finding(severity, f"{on}: Xid {code}{what} since boot, {times}x"))
    return found


def bus_key(address: str) -> str:
    """A PCI address as the driver's log (``PCI:0000:18:00``) and nvidia-smi (``00000000:18:00.0``)
    both reduce to: bus and device, lower case (``18:00``)."""
    parts = address.removeprefix("PCI:").split(".")[0].split(":")
    return ":".join(parts[-2:]).lower()


# --- disk ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filesystem:
    mount: str
    free: int  # bytes
    paths: tuple[str, ...]  # what orch keeps there


def parse_disk(output: str) -> list[Filesystem]:
    """``<path>\\t<df -Pk line>`` per path, grouped by filesystem (mount point), in first-seen order."""
    by_mount: dict[str, tuple[int, list[str]]] = {}
    for line in output.splitlines():
        path, _, df = line.partition("\t")
        cells = df.split()
        if len(cells) < 6 or not cells[3].isdigit():
            continue
        mount = " ".join(cells[5:])
        by_mount.setdefault(mount, (int(cells[3]) * 1024, []))[1].append(path)
    return [Filesystem(m, free, tuple(paths)) for m, (free, paths) in by_mount.items()]


def check_disk(section: Section | None, model_bytes: int) -> list[Finding]:
    """Free space on each filesystem orch writes to, against a margin: a tenth of the model (a new
    revision's shards, caches that grow with it) or ``DISK_MARGIN``, whichever is more."""
    filesystems = parse_disk(section.output) if section is not None else []
    if not filesystems:
        return [Finding("warn", "free disk space not checked: df gave no answer")]
    margin = max(DISK_MARGIN, model_bytes // 10)
    found = []
    for fs in filesystems:
        where = f"{fs.mount} ({', '.join(fs.paths)})"
        if fs.free < DISK_FLOOR:
            found.append(Finding("fail", f"{_gib(fs.free)} free on {where}"))
        elif fs.free < margin:
            found.append(Finding("warn", f"{_gib(fs.free)} free on {where}, below the {_gib(margin)} margin"))
    return found


def _gib(size: int) -> str:
    return f"{size / GIB:.1f} GiB"


# --- the model ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFiles:
    sizes: dict[str, int]  # regular files (links followed) by name; a broken link is absent
    index: dict[str, object] | None  # the shard index, when there is one


def parse_model(files: Section | None, index: Section | None) -> ModelFiles | None:
    """The model directory's files and its index; None when the directory cannot be listed."""
    if files is None or not files.ok:
        return None
    sizes = {}
    for line in files.output.splitlines():
        size, kind, name = [*line.split("\t", 2), "", ""][:3]
        if kind == "f" and size.isdigit():
            sizes[name] = int(size)
    parsed = _json(index.output) if index is not None and index.ok else None
    return ModelFiles(sizes, parsed if isinstance(parsed, dict) else None)


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def shards(index: Mapping[str, object]) -> list[str]:
    weight_map = index.get("weight_map")
    return sorted({str(v) for v in weight_map.values()}) if isinstance(weight_map, dict) else []


def check_model(model: ModelFiles | None, model_path: str) -> list[Finding]:
    """``config.json`` and every shard the index names present and non-empty."""
    if model is None:
        return [Finding("fail", f"model directory {model_path} cannot be listed")]
    missing = [n for n in ["config.json", *(shards(model.index) if model.index else [])] if not model.sizes.get(n)]
    found = []
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        found.append(Finding("fail", f"model {model_path}: missing or empty: {shown}"))
    if model.index is None and not any(n.endswith(".safetensors") for n in model.sizes):
        found.append(Finding("warn", f"model {model_path}: no {INDEX_NAME} and no .safetensors file"))
    return found


# --- the serving Python -------------------------------------------------------------------------------


def check_python(section: Section | None, python: str, sglang_dir: str) -> list[Finding]:
    """Which ``sglang`` ``python`` imports: the one in ``sglang_dir`` is what orch pulls and tunes."""
    lines = section.output.strip().splitlines() if section is not None else []
    found = _json(lines[-1]) if section is not None and section.ok and lines else None
    if not (isinstance(found, list) and len(found) == 2 and isinstance(found[1], str)):
        return [Finding("fail", f"python {python} does not start: {lines[-1] if lines else 'no answer'}")]
    origin, checkout = found[0], found[1].rstrip("/")
    if origin is None:
        return [Finding("fail", f"python {python} cannot import sglang (`orch pull --install`)")]
    if not str(origin).startswith(f"{checkout}/"):
        return [Finding("fail", f"python {python} imports sglang from {origin}, not from sglang_dir {sglang_dir}")]
    return []


# --- NCCL (doctor --nccl) -----------------------------------------------------------------------------

NCCL_TIMEOUT = 90  # seconds per all-reduce run on the host: NCCL's first init on 8 GPUs takes 10-30 s
NCCL_MIB = 64  # the all-reduced buffer per GPU (float32)
NCCL_ROUNDS = 10
P2P_GAP = 1.5  # peer-to-peer this many times slower than without it: a warning
SIMULATED_MARK = " [simulated]"
"""After a number measured on orch's simulated torch (a sandbox host): the label ``orch run`` gives its steps'."""

_NCCL_ALL_REDUCE = """
import json, multiprocessing, socket, sys, time
def rank_main(rank, world, port, mib, rounds, answers):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.ones(mib * 262144, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    if rank == 0:
        answers.put((time.perf_counter() - began) / rounds)
    dist.destroy_process_group()
world, mib, rounds = (int(a) for a in sys.argv[1:4])
try:
    import torch.multiprocessing as mp
except ImportError as exc:
    print(json.dumps({"error": f"cannot import torch ({exc})"}))
    sys.exit(0)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
answers = multiprocessing.get_context("fork").SimpleQueue()
mp.start_processes(rank_main, args=(world, port, mib, rounds, answers), nprocs=world, start_method="fork")
simulated = bool(getattr(sys.modules["torch"], "SIMULATED", False))
print(json.dumps({"seconds": answers.get(), "bytes": mib << 20, "world": world, "simulated": simulated}))
"""
"""One all-reduce of ``NCCL_MIB`` MiB over every GPU, ``NCCL_ROUNDS`` times, with the host's torch
(processes forked before CUDA starts, rendezvous on loopback); prints one JSON line: the seconds per
all-reduce, or why it could not run. A hang is ended by ``timeout`` on the host. ``simulated``: the torch that
ran it is orch's simulated one (``sandbox.hosttools.torch_stub``, whose ``SIMULATED`` the real torch lacks):
its seconds are the sandbox's knobs, not a GPU's."""


def nccl_sections(python: str, gpus: int, timeout: float = NCCL_TIMEOUT) -> list[tuple[str, list[str]]]:
    """The all-reduce with peer-to-peer as the host has it, then with ``NCCL_P2P_DISABLE=1``, each ended
    on the host after ``timeout`` s."""
    bounded = ["timeout", "-k", "5", f"{timeout:g}"]
    script = [python, "-c", _NCCL_ALL_REDUCE, str(gpus), str(NCCL_MIB), str(NCCL_ROUNDS)]
    return [
        ("nccl_p2p", [*bounded, "env", "-u", "NCCL_P2P_DISABLE", *script]),
        ("nccl_no_p2p", [*bounded, "env", "NCCL_P2P_DISABLE=1", *script]),
    ]


@dataclass(frozen=True)
class AllReduce:
    """One run: ``seconds`` per all-reduce, or ``hung`` (``timeout`` ended it), or ``error``; ``simulated``: run
    by orch's simulated torch (a sandbox host), so its seconds are a model, not a measurement."""

    seconds: float | None = None
    bus_gbps: float | None = None
    hung: bool = False
    error: str | None = None
    simulated: bool = False


def parse_all_reduce(section: Section | None) -> AllReduce:
    if section is None:
        return AllReduce(error="no answer")
    if section.exit_status in (124, 137):
        return AllReduce(hung=True)
    lines = section.output.strip().splitlines()
    found = _json(lines[-1]) if lines else None
    if not isinstance(found, dict):
        return AllReduce(error=lines[-1] if lines else f"exit status {section.exit_status}")
    if "error" in found:
        return AllReduce(error=str(found["error"]))
    seconds, size, world = float(found["seconds"]), int(found["bytes"]), int(found["world"])
    bus_gbps = 2 * (world - 1) / world * size / max(seconds, 1e-9) / 1e9
    return AllReduce(seconds, bus_gbps, simulated=found.get("simulated") is True)


def check_nccl(
    p2p: AllReduce, no_p2p: AllReduce, env: Mapping[str, str], timeout: float = NCCL_TIMEOUT
) -> list[Finding]:
    """A hang or a large gap with peer-to-peer on, reported with the setting that avoids it; ``env``:
    the host's inventory env (``NCCL_P2P_DISABLE=1`` there already: the server runs without P2P)."""
    if p2p.error or no_p2p.error:
        return [Finding("warn", f"NCCL not checked: {p2p.error or no_p2p.error}")]
    if p2p.hung and no_p2p.hung:
        return [Finding("fail", f"NCCL all-reduce hangs, with and without NCCL_P2P_DISABLE=1 ({timeout:g} s)")]
    if no_p2p.hung:
        return [Finding("fail", f"NCCL all-reduce hangs with NCCL_P2P_DISABLE=1 ({timeout:g} s)")]
    disabled = env.get("NCCL_P2P_DISABLE") == "1"
    fix = (
        "the host's env in hosts.yaml sets NCCL_P2P_DISABLE=1"
        if disabled
        else "set NCCL_P2P_DISABLE=1 in the host's env in hosts.yaml"
    )
    if p2p.hung:
        return [
            Finding(
                "note" if disabled else "fail", f"NCCL all-reduce hangs with peer-to-peer on ({timeout:g} s; {fix})"
            )
        ]
    assert p2p.seconds is not None and no_p2p.seconds is not None and no_p2p.bus_gbps is not None
    gap = p2p.seconds / max(no_p2p.seconds, 1e-9)
    sim = SIMULATED_MARK if p2p.simulated or no_p2p.simulated else ""  # as run, bench and status label theirs
    if gap >= P2P_GAP:
        return [
            Finding(
                "note" if disabled else "warn", f"NCCL all-reduce {gap:.1f}x slower with peer-to-peer on ({fix}){sim}"
            )
        ]
    bandwidth = f"NCCL all-reduce {p2p.bus_gbps:.1f} GB/s bus bandwidth ({no_p2p.bus_gbps:.1f} without P2P){sim}"
    return [Finding("note", bandwidth)]


# --- the fleet ------------------------------------------------------------------------------------------


def fleet_findings(values: Mapping[str, Mapping[str, str | None]]) -> dict[str, list[Finding]]:
    """Per host, a warning for each value (``driver``, ``CUDA``, ``GPU``) it does not share with most
    hosts checked together; when no value is held by more hosts than any other, every host warns that
    the fleet is split."""
    found: dict[str, list[Finding]] = {host: [] for host in values}
    for kind in sorted({kind for v in values.values() for kind in v}):
        seen = {host: str(v[kind]) for host, v in values.items() if v.get(kind)}
        for host, text in _outliers(kind, seen).items():
            found[host].append(Finding("warn", text))
    return found


def _outliers(kind: str, seen: Mapping[str, str]) -> dict[str, str]:
    counts = Counter(seen.values()).most_common()
    if len(counts) < 2:
        return {}
    (common, n), (_, runner_up) = counts[0], counts[1]
    if n == runner_up:
        split = ", ".join(f"{value} on {k}" for value, k in sorted(counts))
        return {host: f"{kind} {value}: the fleet is split ({split})" for host, value in seen.items()}
    return {h: f"{kind} {v}, the fleet's is {common} ({n} of {len(seen)})" for h, v in seen.items() if v != common}


def verdict(findings: Sequence[Finding]) -> str:
    """``fail`` when any finding fails, else ``warn`` when any warns, else ``ok`` (notes change nothing)."""
    severities = {f.severity for f in findings}
    return "fail" if "fail" in severities else "warn" if "warn" in severities else "ok"


# --- one host, all checks -------------------------------------------------------------------------------


@dataclass
class HostHealth:
    """Doctor's findings on one host and what it compares across the fleet (driver, CUDA, GPU model)."""

    name: str
    findings: list[Finding] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    drain_mark: datetime | None = None  # when ``orch drain`` took the host out, as its mark says (``ops.doctor``)
    # whether what doctor measured (the NCCL all-reduce) ran on orch's simulated torch; None: nothing measured
    simulated: bool | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.findings)

    @property
    def problems(self) -> list[Finding]:
        """The failures, else the warnings: what a refusal names."""
        return [f for f in self.findings if f.severity == self.verdict]


def assess(
    name: str,
    found: Mapping[str, Section],
    gpus: int,
    python: str,
    sglang_dir: str,
    model_path: str,
    env: Mapping[str, str] | None = None,
    nccl_timeout: float = NCCL_TIMEOUT,
    interface_env: Mapping[str, str] | None = None,
) -> HostHealth:
    """Every check over one round trip's ``found`` sections (``sections``' names, ``nccl_sections``' when
    asked, and ``NET_SECTION`` for a replica group's rank); ``env``: the host's inventory env;
    ``interface_env``: the variables naming the network interface its group's ranks meet over."""
    model = parse_model(found.get("model_files"), found.get("model_index"))
    model_bytes = sum(model.sizes.values()) if model else 0
    health = HostHealth(name)
    buses: dict[str, int] = {}
    health.findings += _gpu_findings(found.get("nvidia"), gpus, health.versions, buses)
    health.findings += check_kernel_log(found.get("kernel"), buses)
    health.findings += check_disk(found.get("disk"), model_bytes)
    health.findings += check_model(model, model_path)
    health.findings += check_python(found.get("python"), python, sglang_dir)
    if interface_env:
        health.findings += check_interfaces(found.get("net"), name, interface_env)
    if "nccl_p2p" in found or "nccl_no_p2p" in found:
        p2p, no_p2p = parse_all_reduce(found.get("nccl_p2p")), parse_all_reduce(found.get("nccl_no_p2p"))
        health.findings += check_nccl(p2p, no_p2p, env or {}, nccl_timeout)
        health.simulated = (p2p.simulated or no_p2p.simulated) if p2p.seconds or no_p2p.seconds else None
    return health


def _gpu_findings(
    section: Section | None, gpus: int, versions: dict[str, str | None], buses: dict[str, int]
) -> list[Finding]:
    if section is None or not section.ok:
        last = section.output.strip().splitlines()[-1:] if section else []
        why = "did not answer in time (a wedged driver?)" if section and section.exit_status in (124, 137) else None
        return [Finding("fail", f"nvidia-smi -q: {why or (last[0] if last else 'no answer')}")]
    report = parse_query(section.output)
    names = sorted({g.get("Product Name") or "?" for g in report.gpus})
    versions.update(driver=report.driver, CUDA=report.cuda, GPU=names[0] if len(names) == 1 else None)
    buses.update({bus_key(g.bus_id): index for index, g in enumerate(report.gpus)})
    return check_gpus(report, gpus)
