"""Can a new server start on this host? What ``serve`` checks before it stops the running one.

A server stopped for a replacement that cannot start is an outage nobody asked for (a dropped model
mount, a missing GPU, a full disk, a foreign listener on the port, a Python that imports another SGLang:
the new server crashes, and a rollback crashes the same way). So before any stop, one round trip
(``facts.probe``: several read-only commands in one) reads what the launch needs and the host can show:

- ``model``: the model directory, its ``config.json`` (and the ``architectures`` it names) and its weights
  (``model.safetensors.index.json``, or ``*.safetensors`` shards);
- ``port``: who listens on the server port (``/proc/net/tcp{,6}``, each listener's address, pid, session and
  name): only a listener on the address the server binds, or on a wildcard, is in its way (``holding``);
- ``workdir``: orch's workdir (or the directory it will be made in) writable, and its free space (``df``);
- ``sglang``: where ``host.python`` imports ``sglang`` from (an editable install of ``sglang_dir``) and
  its version;
- ``net``: the host's network interfaces (``/sys/class/net``), which a replica group's rank names to NCCL
  and Gloo (checked only then).

The GPUs come from the nvidia-smi query serve already makes (``Needs.shown_gpus``). ``parse`` reads the
answer into ``HostFacts``; ``problems`` says what stands in the way, each with its fix. Pure: the
session runs it (``ops.serve.check_replacement``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.facts import probe

MIN_FREE_MIB = 100  # a job's directory and a server's log for a while; below this a start may fail half-written
MODEL_TIMEOUT = 15  # seconds: a hung NFS mount must not hang the check
PYTHON_TIMEOUT = 120  # importing a real SGLang takes seconds

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# $1 the model directory.
_MODEL = r"""
m=$1
[ -d "$m" ] || { echo "dir missing"; exit 0; }
echo "dir ok"
if [ -r "$m/config.json" ]; then echo "config ok"
  echo "archs $(head -c 65536 "$m/config.json" | tr -d '\n' | grep -o '"architectures" *: *\[[^]]*')"
else echo "config missing"; fi
if [ -r "$m/model.safetensors.index.json" ]; then echo "weights index"
else n=0; for f in "$m"/*.safetensors; do [ -e "$f" ] && n=$((n + 1)); done; echo "weights shards $n"; fi
"""

# $1 the port: "free", or one "listener ADDRESS PID SESSION NAME" line per process holding a listening socket on
# it, ADDRESS its local address as /proc/net/tcp{,6} write it ("listener ADDRESS - - -" when the socket's
# process cannot be seen).
_PORT = r"""
port=$1
hex=$(printf ':%04X' "$port")
found=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null \
  | awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print substr($2, 1, length($2) - 5), $10 }' \
  | sort -u)
[ -n "$found" ] || { echo free; exit 0; }
echo "$found" | while read -r addr ino; do
  seen=0
  for fd in $(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$ino\]" 2>/dev/null); do
    pid=${fd#/proc/}; pid=${pid%%/*}
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    name=${stat#*(}; name=${name%)*}
    rest=${stat##*) }
    set -- $rest
    echo "listener $addr $pid $4 $name"; seen=1
  done
  [ $seen = 1 ] || echo "listener $addr - - -"
done
"""

# $1 the workdir: the directory checked (the workdir, or the nearest existing parent it will be made in),
# whether orch can write there, and the KiB free there.
_WORKDIR = r"""
w=$1; d=$w
while [ ! -d "$d" ]; do d=$(dirname -- "$d"); done
echo "checked $d"
if [ "$d" = "$w" ]; then
  t=$(mktemp -p "$d" .orch-write-check.XXXXXX 2>&1) && rm -f -- "$t" && echo writable || echo "readonly $t"
else
  [ -w "$d" ] && echo writable || echo "readonly"
fi
df -Pk -- "$d" | awk 'NR == 2 { print "free", $4 }'
"""

# argv[1] the sglang_dir: where sglang is imported from (resolved), where it should be, its version.
_SGLANG = """
import os, sys
want = os.path.realpath(os.path.join(sys.argv[1], "python", "sglang"))
print("want", want)
try:
    import sglang
except Exception as exc:
    print("error", (type(exc).__name__ + ": " + str(exc)).replace(chr(10), " ")[:300])
    raise SystemExit(0)
print("file", os.path.realpath(os.path.dirname(sglang.__file__ or "")))
print("version", getattr(sglang, "__version__", "unknown"))
"""


def sections(model_path: str, port: int, workdir: str, python: str, sglang_dir: str) -> list[tuple[str, list[str]]]:
    """The probe's sections (``facts.probe.probe_argv`` frames them into one command)."""
    return [
        ("model", ["timeout", "-k", "2", str(MODEL_TIMEOUT), "sh", "-c", _MODEL, "orch-model", model_path]),
        ("port", listeners_argv(port)),
        ("workdir", ["timeout", "-k", "2", str(MODEL_TIMEOUT), "sh", "-c", _WORKDIR, "orch-workdir", workdir]),
        ("sglang", sglang_argv(python, sglang_dir)),
        ("net", ["ls", "-1", "/sys/class/net"]),
    ]


def sglang_argv(python: str, sglang_dir: str) -> list[str]:
    """Where ``python`` imports sglang from, and its version (the ``sglang`` section: ``parse_sglang``)."""
    return ["timeout", "-k", "5", str(PYTHON_TIMEOUT), python, "-c", _SGLANG, sglang_dir]


def parse_sglang(output: str) -> SGLangImport:
    """``sglang_argv``'s output."""
    return _sglang([line.split(" ", 1) for line in output.splitlines() if line.strip()])


def sglang_field(found: SGLangImport, section_error: str | None = None) -> dict[str, Any]:
    """What ``orch status`` shows of it (``--json``'s ``sglang_import``): where from, the version, whether
    it is the checkout (``editable``), or why it could not be read."""
    return {
        "from": found.file,
        "version": found.version,
        "editable": found.editable if found.file is not None else None,
        "expected": found.want,
        "error": section_error or found.error,
    }


def listeners_argv(port: int) -> list[str]:
    """Who listens on ``port`` (the ``port`` section alone: ``parse_listeners`` reads it)."""
    return ["sh", "-c", _PORT, "orch-port", str(port)]


def parse_listeners(output: str) -> tuple[Listener, ...]:
    """The listeners of ``listeners_argv``'s output (none: the port is free)."""
    listeners: tuple[Listener, ...] = _port(_rows(output, "port"))["listeners"]
    return listeners


def holding(listeners: Sequence[Listener], address: str | None) -> list[Listener]:
    """The ``listeners`` that hold the port for a server bound to ``address`` (its ``--host``): those on that
    address or on a wildcard (0.0.0.0, ::), and those whose address the host did not show; all of them when
    ``address`` is a wildcard, or a name or None (where it binds is not known here). A listener on another
    address (an sshd on 127.0.0.2 beside a server on 127.0.0.1) shares the port's number, not the port."""
    bound = _ip(address)
    return [x for x in listeners if bound is None or _shares(_ip(x.address), bound)]


def _shares(listening: IP | None, bound: IP) -> bool:
    return listening is None or listening.is_unspecified or bound.is_unspecified or listening == bound


def _ip(text: str | None) -> IP | None:
    """``text`` as an IP address (an IPv4-mapped IPv6 one as its IPv4), None when it is not one."""
    try:
        ip = ipaddress.ip_address(text or "")
    except ValueError:
        return None
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def proc_net_address(hex_text: str) -> str | None:
    """A local address as ``/proc/net/tcp`` (``0100007F``: 127.0.0.1) or ``/proc/net/tcp6`` (32 digits) writes
    it: 32-bit words in the host's byte order (little-endian on x86-64 and arm64, the hosts orch serves on).
    None when it is neither."""
    if not re.fullmatch(r"[0-9A-Fa-f]{8}|[0-9A-Fa-f]{32}", hex_text):
        return None
    raw = b"".join(bytes.fromhex(hex_text[i : i + 8])[::-1] for i in range(0, len(hex_text), 8))
    return str(ipaddress.ip_address(raw))


def probe_argv(model_path: str, port: int, workdir: str, python: str, sglang_dir: str) -> list[str]:
    """The whole check as one remote command."""
    return probe.probe_argv(sections(model_path, port, workdir, python, sglang_dir))


@dataclass(frozen=True)
class Listener:
    """A process listening on the server port (pid and session None: the host would not say), and the
    local address it listens on (None: not read)."""

    pid: int | None
    session: int | None
    name: str
    address: str | None = None


@dataclass(frozen=True)
class SGLangImport:
    """Where the host's python imports ``sglang`` from, where it should (``sglang_dir``), and its version;
    ``error`` when it cannot import it at all."""

    file: str | None = None
    want: str | None = None
    version: str | None = None
    error: str | None = None

    @property
    def editable(self) -> bool:
        """The package is the checkout orch pulls (an editable install of ``sglang_dir``)."""
        return self.file is not None and self.file == self.want


@dataclass(frozen=True)
class HostFacts:
    """What the host showed. A section that did not answer leaves its fields None (unknown: not refused)."""

    model_dir: bool | None = None
    model_config: bool | None = None
    model_architectures: tuple[str, ...] | None = None  # config.json's "architectures" (None: not read)
    weights: str | None = None  # "index", "shards N"
    listeners: tuple[Listener, ...] | None = None
    workdir_checked: str | None = None
    workdir_writable: bool | None = None
    workdir_error: str = ""
    free_kib: int | None = None
    sglang: SGLangImport = field(default_factory=SGLangImport)
    interfaces: tuple[str, ...] | None = None  # the network interfaces (None: not listed; checked for groups only)
    unanswered: tuple[str, ...] = ()  # sections that failed or timed out, with why


def parse(stdout: str) -> HostFacts:
    """The probe's answer; sections missing or failed are named in ``unanswered``."""
    found = probe.parse(stdout)
    unanswered = []
    lines: dict[str, list[list[str]]] = {}
    for name in ("model", "port", "workdir", "sglang"):
        section = found.get(name)
        if section is None:
            unanswered.append(f"{name}: no answer")
            continue
        if section.exit_status in probe.TIMED_OUT:
            unanswered.append(f"{name}: timed out")
            continue
        if not section.ok:
            unanswered.append(f"{name}: exit {section.exit_status}: {_last(section.output)}")
            continue
        lines[name] = _rows(section.output, name)
    net = found.get("net")
    interfaces = tuple(line.strip() for line in net.output.splitlines() if line.strip()) if net and net.ok else None
    return HostFacts(**_model(lines.get("model")), **_port(lines.get("port")), **_workdir(lines.get("workdir")),
                     sglang=_sglang(lines.get("sglang")), interfaces=interfaces or None,
                     unanswered=tuple(unanswered))  # fmt: skip


def _rows(output: str, section: str) -> list[list[str]]:
    """A section's lines, each split into its words (the last word keeps its spaces: a process name)."""
    words = 5 if section == "port" else 4
    return [line.split(" ", words - 1) for line in output.splitlines() if line.strip()]


def _last(text: str) -> str:
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "(no output)")
    return last.strip()[:200]


def _values(rows: list[list[str]], key: str) -> list[str] | None:
    return next((row[1:] for row in rows if row[0] == key), None)


def _model(rows: list[list[str]] | None) -> dict[str, Any]:
    if rows is None:
        return {}
    directory = _values(rows, "dir")
    config = _values(rows, "config")
    weights = _values(rows, "weights")
    archs = _values(rows, "archs")
    names = re.findall(r'"([A-Za-z0-9_.]+)"', " ".join(archs or []).partition(":")[2])
    return {
        "model_dir": directory == ["ok"],
        "model_config": config == ["ok"] if config is not None else None,
        "model_architectures": tuple(names) or None,
        "weights": None if not weights or weights == ["shards", "0"] else " ".join(weights),
    }


def _port(rows: list[list[str]] | None) -> dict[str, Any]:
    if rows is None:
        return {}
    listeners = []
    for row in rows:
        if row[0] == "listener" and len(row) == 5:
            address, pid, session, name = row[1:]
            shown = name if name != "-" else "unknown"
            listeners.append(Listener(_int(pid), _int(session), shown, proc_net_address(address)))
    unique = tuple(dict.fromkeys(listeners))
    return {"listeners": unique}


def _workdir(rows: list[list[str]] | None) -> dict[str, Any]:
    if rows is None:
        return {}
    checked = _values(rows, "checked")
    readonly = _values(rows, "readonly")
    free = _values(rows, "free")
    return {
        "workdir_checked": " ".join(checked) if checked else None,
        "workdir_writable": _values(rows, "writable") is not None,
        "workdir_error": " ".join(readonly or []),
        "free_kib": _int(free[0]) if free else None,
    }


def _sglang(rows: list[list[str]] | None) -> SGLangImport:
    if rows is None:
        return SGLangImport()

    def value(key: str) -> str | None:
        found = _values(rows, key)
        return " ".join(found) if found is not None else None

    return SGLangImport(value("file"), value("want"), value("version"), value("error"))


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


# --- what stands in the way --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Needs:
    """What the new launch needs on the host: the inventory's paths and port, the GPU indexes the server
    uses (all of them, uncapped: ``facts.server.needed_gpus``) against the indexes nvidia-smi shows, the
    session of orch's running server (its job's wrapper pid), whose listener is no obstacle, and the address
    the server binds, beside which a listener on another address is no obstacle either."""

    host: str
    model_path: str
    port: int
    workdir: str
    python: str
    sglang_dir: str
    gpus: Sequence[int]
    shown_gpus: Sequence[int] | None  # None: nvidia-smi was not read
    own_session: int | None = None
    bind_address: str | None = None  # where the server listens (its ``--host``); None: any listener is in the way
    architecture: str | None = None  # the recipe's, which config.json's architectures must name
    min_free_mib: int = MIN_FREE_MIB
    interface_env: Mapping[str, str] = field(default_factory=dict)  # a group's rank: NCCL_SOCKET_IFNAME=...


@dataclass(frozen=True)
class Obstacle:
    """One thing that stops the new server from starting, and how to fix it."""

    what: str
    fix: str
    kind: str = ""  # the section it comes from: model, gpus, port, workdir, sglang

    def __str__(self) -> str:
        return f"{self.what} ({self.fix})"


def problems(found: HostFacts, needs: Needs) -> list[Obstacle]:
    """Everything that would make the new server fail to start; empty when it can start."""
    return [
        *_model_problems(found, needs),
        *_gpu_problems(needs),
        *_port_problems(found, needs),
        *_workdir_problems(found, needs),
        *_sglang_problems(found.sglang, needs),
        *_interface_problems(found, needs),
    ]


def _model_problems(found: HostFacts, needs: Needs) -> list[Obstacle]:
    where, fix = needs.model_path, f"mount or copy the model there, or fix `model_path` for {needs.host}"
    if found.model_dir is False:
        return [Obstacle(f"model directory {where} is missing (a dropped mount?)", fix)]
    out = []
    if found.model_config is False:
        out.append(Obstacle(f"{where}/config.json is missing", fix))
    if found.model_dir and found.weights is None:
        out.append(Obstacle(f"no weights in {where} (no model.safetensors.index.json, no *.safetensors)", fix))
    archs = found.model_architectures
    if archs and needs.architecture and needs.architecture not in archs:
        out.append(Obstacle(
            f"the model in {where} is {', '.join(archs)} (its config.json), not the recipe's {needs.architecture}",
            f"fix `model_path` for {needs.host}, or serve that model with a playbook for it",
        ))  # fmt: skip
    return out


def _gpu_problems(needs: Needs) -> list[Obstacle]:
    if needs.shown_gpus is None or not needs.gpus:
        return []
    missing = sorted(set(needs.gpus) - set(needs.shown_gpus))
    if not missing:
        return []
    return [
        Obstacle(
            f"the server needs {len(needs.gpus)} GPUs ({_span(needs.gpus)}) but nvidia-smi shows "
            f"{len(needs.shown_gpus)} (no GPU {_span(missing)})",
            "check the host's GPUs with nvidia-smi, or lower the recipe's tp/dp",
        )
    ]


def _span(indexes: Sequence[int]) -> str:
    ordered = sorted(indexes)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def _port_problems(found: HostFacts, needs: Needs) -> list[Obstacle]:
    held = holding(found.listeners or (), needs.bind_address)
    foreign = [x for x in held if needs.own_session is None or x.session != needs.own_session]
    if not foreign:
        return []
    named = held_by(foreign)
    return [
        Obstacle(
            f"port {needs.port} is held by {named}, not by orch's server",
            f"free the port (orch never kills a process it did not start) or change `server_port` for {needs.host}",
            "port",
        )
    ]


def held_by(listeners: Sequence[Listener]) -> str:
    """The processes of ``listeners`` in words, with the address each listens on:
    ``pid 4242 (python3) on 0.0.0.0, a process orch cannot see on 127.0.0.1``."""
    return ", ".join(_process(x) + (f" on {x.address}" if x.address else "") for x in listeners)


def _process(listener: Listener) -> str:
    return f"pid {listener.pid} ({listener.name})" if listener.pid is not None else "a process orch cannot see"


def _workdir_problems(found: HostFacts, needs: Needs) -> list[Obstacle]:
    where = found.workdir_checked or needs.workdir
    fix = f"free space on {where}'s filesystem, or point `workdir` for {needs.host} elsewhere"
    if found.workdir_writable is False:
        said = f": {found.workdir_error}" if found.workdir_error else ""
        return [Obstacle(f"workdir {where} is not writable{said}", fix)]
    if found.free_kib is not None and found.free_kib < needs.min_free_mib * 1024:
        free = found.free_kib // 1024
        said = f"no space left for a job in {where}: {free} MiB free (a job needs {needs.min_free_mib})"
        return [Obstacle(said, fix)]
    return []


def _sglang_problems(found: SGLangImport, needs: Needs) -> list[Obstacle]:
    fix = f"`orch pull --install --host {needs.host}` installs the checkout into {needs.python}"
    if found.error is not None:
        return [Obstacle(f"{needs.python} cannot import sglang: {found.error}", fix, "sglang")]
    if found.file is not None and not found.editable:
        want = found.want or f"{needs.sglang_dir}/python/sglang"
        return [
            Obstacle(f"{needs.python} imports sglang from {found.file}, not from {want} (sglang_dir)", fix, "sglang")
        ]
    return []


def _interface_problems(found: HostFacts, needs: Needs) -> list[Obstacle]:
    """A replica group's rank meets the others over the interface its launch environment names
    (``Needs.interface_env``): NCCL takes name prefixes (``ens1f0``), ``=name`` for one exact name and
    ``^a,b`` to exclude; Gloo takes exact names. A name the host lacks fails the rank as it starts."""
    if not needs.interface_env:
        return []
    fix = interface_fix(needs.host)
    if found.interfaces is None:
        return [Obstacle("could not list the host's network interfaces (/sys/class/net)", fix, "net")]
    what = missing_interface(found.interfaces, needs.interface_env)
    return [Obstacle(f"{what}: the rank would fail to start", fix, "net")] if what else []


def interface_fix(host: str) -> str:
    return f"set the `network_interface` of {host}'s group in hosts.yaml to one of its interfaces"


def missing_interface(have: Sequence[str], interface_env: Mapping[str, str]) -> str | None:
    """``no network interface eth9 for NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME (the host has eth0, lo)`` when
    the host's interfaces ``have`` lack what ``interface_env`` names, else None. NCCL takes name prefixes
    (``ens1f0``), ``=name`` for exact names and ``^a,b`` to exclude; Gloo takes exact names."""
    missing: list[str] = []
    variables: list[str] = []
    for variable, value in interface_env.items():
        names = value.removeprefix("=").split(",")
        if variable.startswith("GLOO"):  # Gloo: exact names, each one a device
            lacking = [name for name in value.split(",") if name not in have]
        elif value.startswith("^"):  # NCCL: every interface but these
            lacking = []
        elif value.startswith("="):  # NCCL: exact names, any of them
            lacking = [] if any(name in have for name in names) else names
        else:  # NCCL: name prefixes, any of them
            lacking = [] if any(i.startswith(name) for name in names for i in have) else names
        missing += [name for name in lacking if name not in missing]
        variables += [variable] if lacking else []
    if not missing:
        return None
    return f"no network interface {', '.join(missing)} for {', '.join(variables)} (the host has {', '.join(have)})"


_UNANSWERED_FIX = {
    "model": "check the model's mount on the host",
    "port": "check that the host has awk and find",
    "workdir": "check the workdir's filesystem on the host",
    "sglang": "check `python` for the host in the inventory",
}


def unanswered_problems(found: HostFacts) -> list[Obstacle]:
    """Sections the host did not answer: the check could not be made, so nothing may be stopped."""
    sections = [(why.split(":", 1)[0], why) for why in found.unanswered]
    return [
        Obstacle(f"could not check {why}", _UNANSWERED_FIX.get(name, "see `orch status --wide`"), name)
        for name, why in sections
    ]
