"""The inventory: ``hosts.yaml``, validated once at the boundary.

Past ``load_inventory`` there are no raw dicts: every host is a ``Host`` with its defaults merged in.
Every error names the file, the host and the key, says what is wrong and how to fix it, and exits 2.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from orchestrator.errors import ConfigError, UsageError
from orchestrator.text import find_secret, is_env_name, looks_secret
from orchestrator.yamlfile import YamlModel, control_character, did_you_mean, load_yaml, read_text

DEFAULT_INVENTORY = Path("hosts.yaml")
MAX_NAME_BYTES = 200
"""The longest host or group name, in UTF-8 bytes: a name labels every table row, log line and metric, and
one longer than this is a mistake (a pasted key, a path), not a name."""
_UPSTREAM = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*/[A-Za-z0-9_.][A-Za-z0-9_./-]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")
_REMOTE_PATH_KEYS = ("sglang_dir", "python", "workdir", "model_path")
_GATEWAY_URL = re.compile(r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}/?$")
_COMMAND = re.compile(r"^[A-Za-z0-9_.+-]+$")
# What NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME take: interface names or prefixes, comma-separated, optionally
# led by ``^`` (exclude) or ``=`` (exact match).
_INTERFACE = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*$")
# What the hosts of one replica group must agree on: every rank runs the same server arguments.
GROUP_ALIKE_KEYS = ("gpus", "model_path")
# The flags ``gateway.smg_argv`` sets from the inventory itself, and the one orch never puts on a command line.
GATEWAY_OWN_FLAGS = ("--host", "--port", "--prometheus-host", "--prometheus-port", "--worker-urls", "--api-key")


class HostSettings(YamlModel):
    """Every key a host may set, all with defaults; ``defaults:`` in hosts.yaml sets them for all hosts.

    Strict types (as ``ReplicaGroup`` and ``Gateway``): YAML gives a number as a number, so ``port: 22.0`` or
    ``port: "22"`` is refused as the wrong type, as ``gpus: 8.5`` was, not read silently as 22."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    ssh_config: str | None = None
    transport: Literal["ssh", "local"] = "ssh"
    sglang_dir: str = "/root/sglang"
    python: str = "/root/sglang/.venv/bin/python"
    workdir: str = "/root/.orch"
    upstream: str = "origin/main"
    model_path: str = "/models/DeepSeek-V4-Flash"
    server_port: int = Field(30000, ge=1, le=65535)
    gpus: int = Field(8, ge=1, le=64)
    env: dict[str, str] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    playbook: str | None = None

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not _USER.match(value):
            raise ValueError(f"{value!r} is not a user name")
        return value

    @field_validator("proxy_jump")
    @classmethod
    def _proxy_jump(cls, value: str | None) -> str | None:
        if value is not None and value != "none":
            parse_jump(value)
        return value

    @field_validator(*_REMOTE_PATH_KEYS)
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(
                f"must be an absolute path on the host (got {value!r}); orch quotes every path, "
                "so '~' and '$HOME' would not be expanded"
            )
        return value

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        if not _UPSTREAM.match(value) or ".." in value:
            raise ValueError(f"must be REMOTE/BRANCH such as 'origin/main' (got {value!r})")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @property
    def remote(self) -> str:
        """The remote name of ``upstream`` (``origin`` of ``origin/main``)."""
        return self.upstream.split("/", 1)[0]

    @property
    def branch(self) -> str:
        return self.upstream.split("/", 1)[1]


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (or ``ssh://...``) of a jump host, as OpenSSH's ProxyJump takes it: user,
    host, port. One jump host: a comma list (a chain of them) is refused. ValueError says what is wrong.

    >>> parse_jump("ops@bastion.example:2222")
    ('ops', 'bastion.example', 2222)
    >>> parse_jump("[::1]")
    (None, '::1', None)
    """
    if "," in spec:
        raise ValueError(f"orch connects through one jump host, not a chain (got {spec!r})")
    rest = spec.removeprefix("ssh://")
    user, at, rest = rest.rpartition("@")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":") if tail.startswith(":") else ("" if not tail else None)
    else:
        host, _, port = rest.partition(":")
    bad_port = port is None or (port != "" and (not port.isdigit() or not 1 <= int(port) <= 65535))
    if (at and not _USER.match(user)) or not host or not _ADDRESS.match(host) or host.startswith("-") or bad_port:
        raise ValueError(f"must be [USER@]HOST[:PORT] of one jump host, or 'none' (got {spec!r})")
    return user or None, host, int(port) if port else None


class Host(HostSettings):
    """One host of the inventory, defaults merged in."""

    name: str
    address: str

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        """A host name, an IPv4 or an IPv6 address (``::1``, which has colons of its own); ``HOST:PORT`` or
        ``[V6]:PORT`` is refused here, where the key is named, not at the first connection to ``HOST:PORT:22``."""
        if not value or not _ADDRESS.match(value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a host name or IP address")
        host, port = _host_and_port(value)
        if port is not None:
            raise ValueError(
                f"has a port in it; the SSH port is the host's own key 'port': write address: {host}, port: {port}"
            )
        return value

    @property
    def label(self) -> str:
        return f"{self.name} ({self.address})"


def _host_and_port(address: str) -> tuple[str, str | None]:
    """``address`` split into its host and the port written into it, if any: ``10.0.0.1:2222`` and
    ``[::1]:2222`` have one; ``::1`` (two colons or more: an IPv6 address) and ``gpu-1`` have none."""
    if address.startswith("[") and "]:" in address:
        host, _, port = address[1:].partition("]:")
        return host, port
    if address.count(":") == 1:
        host, _, port = address.partition(":")
        return host, port
    return address, None


class ReplicaGroup(YamlModel):
    """``groups:`` in hosts.yaml: hosts that together run one server (issue 26), e.g. DeepSeek-V4-Pro with
    pipeline parallelism over two 8-GPU hosts.

    ``hosts`` in rank order: the first is rank 0, the only one serving HTTP. ``playbook`` is the recipe the
    group serves (its hosts' default playbook). ``network_interface`` is the network interface the ranks
    talk over, given to NCCL and Gloo in the launch environment (the recipe's ``multinode.interface_env``
    names the variables); without it they pick one themselves. ``rank0_address`` is where the other ranks
    reach rank 0 (``--dist-init-addr``), by default rank 0's inventory address. A host outside every group
    is a group of one: it serves alone, as before groups existed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    hosts: list[str] = Field(min_length=2)
    playbook: str
    network_interface: str | None = None
    rank0_address: str | None = None

    @field_validator("hosts")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        twice = next((h for i, h in enumerate(value) if h in value[:i]), None)
        if twice is not None:
            raise ValueError(f"{twice!r} is listed twice; each host runs one rank")
        return value

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, value: str | None) -> str | None:
        if value is not None and not _INTERFACE.match(value):
            raise ValueError("must be a network interface name such as ens1f0np0 (or NCCL's list form: ^docker,lo)")
        return value

    @field_validator("rank0_address")
    @classmethod
    def _address(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A host name, an IPv4 or an IPv6 address, as a host's ``address``; ``HOST:PORT`` is refused here: the
        ranks meet on the playbook's ``multinode.dist_init_port``, and orch launched them at
        ``--dist-init-addr [HOST:PORT]:20000``."""
        if value is None:
            return value
        if not _ADDRESS.match(value) or value.startswith("-"):
            raise ValueError(f"{value!r} is not a host name or IP address")
        host, port = _host_and_port(value)
        if port is not None:
            playbook = info.data.get("playbook")
            raise ValueError(
                f"has a port in it; the port the ranks meet on is the playbook's multinode.dist_init_port: write "
                f"rank0_address: {host}, and dist_init_port: {port} under multinode: in "
                + (f"playbook {playbook!r}" if playbook else "the group's playbook")
            )
        return value

    @property
    def rank0(self) -> str:
        """The name of the host that runs rank 0 (the first listed), where the server answers HTTP."""
        return self.hosts[0]


class Gateway(YamlModel):
    """``gateway:`` in hosts.yaml: the SGLang Model Gateway (``smg``) in front of the fleet (issue 12).

    ``api_key_env`` names the environment variable holding the gateway's API key: the key itself is
    never written in hosts.yaml, on a command line, in a log or in the state file. ``host`` is the
    inventory host on which ``orch gateway up`` runs ``smg``, with ``python`` (the interpreter that has
    ``sglang-router``), ``env`` (plain variables such as ``HF_ENDPOINT``: smg looks tokenizers up on
    Hugging Face at registration) and ``args`` (smg's other flags, e.g. ``[--policy, round_robin]``).
    ``metrics_port`` is where smg serves its Prometheus metrics, beside the gateway's address (default:
    the gateway's port + 1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    url: str
    api_key_env: str | None = None
    host: str | None = None
    python: str = "python3"
    env: dict[str, str] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        """``http://HOST:PORT``, a trailing ``/`` taken off (``http://H:P/`` is the same URL; orch appends its
        paths to it, and reads the port from its end); a port outside 1-65535 refused here, not at first use."""
        if not _GATEWAY_URL.match(value):
            raise ValueError("must be http://HOST:PORT (no path, no user or password), e.g. http://10.1.2.3:30080")
        value = value.removesuffix("/")
        port = int(value.rsplit(":", 1)[1])
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is not a TCP port (1-65535), e.g. http://10.1.2.3:30080")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not is_env_name(value):
            raise ValueError(f"{value!r} is not an environment variable name (the variable holds the key)")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not (value.startswith("/") or _COMMAND.match(value)) or value.startswith("-"):
            raise ValueError(
                "must be an absolute path on the gateway host, or a command name found on its PATH "
                "(the interpreter sglang-router is installed in), e.g. /opt/smg/.venv/bin/python"
            )
        return value

    @field_validator("env")
    @classmethod
    def _plain_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not is_env_name(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        if find_secret(value) or any(looks_secret(name) for name in value):
            raise ValueError(
                "looks like a secret: these variables are on the gateway job's command line and in its record; "
                "the only secret the gateway takes is its API key, named by api_key_env"
            )
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for arg in value:
            own = next((f for f in GATEWAY_OWN_FLAGS if arg == f or arg.startswith(f + "=")), None)
            if own:
                raise ValueError(
                    f"{own} is set by orch (from url, the serving hosts and api_key_env); leave it out of args"
                )
        secret = find_secret(value)
        if secret:
            raise ValueError(f"looks like a secret ({secret!r}): args are on the gateway job's command line")
        return value

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def metrics(self) -> int:
        """The port smg serves its Prometheus metrics on (``metrics_port``, else the gateway's port + 1)."""
        return self.metrics_port or self.port + 1

    @property
    def bind_address(self) -> str:
        """The address part of ``url`` (what ``smg --host`` binds on ``host``)."""
        return self.url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    hosts: dict[str, Host]
    gateway: Gateway | None = None
    groups: dict[str, ReplicaGroup] = Field(default_factory=dict)

    def group_of(self, host: str) -> ReplicaGroup | None:
        """The replica group host ``host`` (a name) runs a rank of; None: it serves alone."""
        return next((g for g in self.groups.values() if host in g.hosts), None)

    def select(self, names: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> list[Host]:
        """Hosts named (by name or address) or tagged; neither → every host. Unknown → exit 2."""
        if not names and not tags:
            return list(self.hosts.values())
        chosen = {h.name: h for h in self._by_names(names)}
        for tag in tags:
            tagged = [h for h in self.hosts.values() if tag in h.tags]
            if not tagged:
                known = sorted({t for h in self.hosts.values() for t in h.tags})
                raise UsageError(f"no host in {self.path} has tag {tag!r}; tags in use: {', '.join(known) or 'none'}")
            chosen.update((h.name, h) for h in tagged)
        return [h for h in self.hosts.values() if h.name in chosen]

    def _by_names(self, names: tuple[str, ...]) -> list[Host]:
        found: list[Host] = []
        for wanted in names:
            match = [h for h in self.hosts.values() if wanted in (h.name, h.address)]
            if not match:
                raise UsageError(
                    f"unknown host {wanted!r} in {self.path}; known hosts: {', '.join(self.hosts)}",
                    hint="use a host's name or address as written in the inventory",
                )
            found += match
        return found


def inventory_path(option: Path | None) -> Path:
    """``--inventory``, else ``$ORCH_INVENTORY``, else ``./hosts.yaml``."""
    if option is not None:
        return option
    return Path(os.environ.get("ORCH_INVENTORY") or DEFAULT_INVENTORY)


def load_inventory(path: Path) -> Inventory:
    raw = _read_yaml(path)
    _refuse_control_characters(path, raw)
    defaults = _validate_defaults(path, {} if raw.get("defaults") is None else raw["defaults"])  # `defaults:` empty
    hosts_raw = raw.get("hosts")
    if not isinstance(hosts_raw, dict) or not hosts_raw:
        raise ConfigError(f"{path}: 'hosts' must be a mapping of host names to settings, with at least one host")
    hosts = {str(name): _validate_host(path, str(name), spec, defaults) for name, spec in hosts_raw.items()}
    _refuse_one_box_twice(path, hosts)
    gateway = _validate_gateway(path, raw["gateway"], hosts) if "gateway" in raw else None
    groups = _validate_groups(path, raw.get("groups", {}), hosts)
    hosts = _with_group_playbooks(path, hosts, hosts_raw, groups)
    return Inventory(path=path, hosts=hosts, gateway=gateway, groups=groups)


_TOP_LEVEL = ("defaults", "hosts", "gateway", "groups")
"""The keys an inventory takes at its top level."""


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise ConfigError(
            f"inventory {path} not found", hint="pass --inventory PATH or set ORCH_INVENTORY (see docs/inventory.md)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read inventory: {exc.strerror or exc}") from None
    raw = load_yaml(path, text)
    optional = ", ".join(repr(k) for k in _TOP_LEVEL if k != "hosts")
    if raw is None:  # nothing but comments and blank lines, or no byte at all
        raise ConfigError(
            f"{path}: the inventory is empty; its top level takes 'hosts' (and optional {optional})",
            hint="add hosts: {NAME: {address: ADDRESS}} (see docs/inventory.md)",
        )
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with 'hosts' (and optional {optional})")
    unknown = sorted(set(raw) - set(_TOP_LEVEL), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), _TOP_LEVEL, n=1)
        typo = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{path}: unknown top-level key {unknown[0]!r}{typo}; allowed: {', '.join(_TOP_LEVEL)}")
    return raw


def _refuse_control_characters(path: Path, raw: dict[str, Any]) -> None:
    """A newline, CR, NUL, ... anywhere in hosts.yaml → exit 2 naming the host and key, never the value."""
    hosts = raw.get("hosts")
    sections: list[tuple[str, Any]] = [("defaults", raw.get("defaults")), ("gateway", raw.get("gateway"))]
    if isinstance(hosts, dict):
        for name, spec in hosts.items():
            if control_character(name):
                raise ConfigError(f"{path}: host {name!r}: the host name holds a control character")
            sections.append((f"host {name!r}", spec))
    groups = raw.get("groups")
    if isinstance(groups, dict):
        for name, spec in groups.items():
            if control_character(name):
                raise ConfigError(f"{path}: group {name!r}: the group name holds a control character")
            sections.append((f"group {name!r}", spec))
    for where, spec in sections:
        found = control_character(spec)
        if found:
            key, what = found
            raise ConfigError(
                f"{path}: {where}, key {key!r}: holds {what}; orch uses every value literally on the host, "
                "where a newline, carriage return or NUL would cut or change it",
                hint="remove the character (a double-quoted YAML string turns \\n, \\r, \\0 into one)",
            )


def _refuse_one_box_twice(path: Path, hosts: dict[str, Host]) -> None:
    """Two hosts at one address and SSH port are one machine under two names: orch would tune or serve it
    twice at once on the same GPUs (issue 30). Exit 2 naming both. Hosts reached through different jump
    hosts may be different machines (one private address behind two bastions), and ``transport: local``
    hosts have no address to compare: both are left alone."""
    seen: dict[tuple[str, int, str | None], str] = {}
    for host in hosts.values():
        if host.transport == "local":
            continue
        first = seen.setdefault((host.address.lower(), host.port, host.proxy_jump), host.name)
        if first != host.name:
            raise ConfigError(
                f"{path}: hosts {first!r} and {host.name!r} are one machine ({host.address}, SSH port {host.port}); "
                "orch would run two jobs at once on its GPUs",
                hint="keep one of them (a second name for a host is not needed: select it by name or address)",
            )


def _validate_defaults(path: Path, raw: Any) -> dict[str, Any]:
    """``defaults:``: host settings (``HostSettings``), which every host inherits. A key only a host has
    (``address``) is refused as such; an unknown key is named with the keys ``defaults:`` takes."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: 'defaults' must be a mapping of host settings")
    per_host = next((k for k in raw if k in Host.model_fields and k not in HostSettings.model_fields), None)
    if per_host is not None:
        raise ConfigError(
            f"{path}: defaults: key {per_host!r} is set per host, not under defaults (each host has its own)",
            hint=f"move it under each host in 'hosts:', e.g. hosts: {{gpu-1: {{{per_host}: ...}}}}",
        )
    try:
        HostSettings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(path, "defaults", exc, HostSettings)) from None
    return raw


def _check_name(path: Path, kind: str, name: str) -> None:
    """A host or group name is one word on the command line (``--host NAME``), in every table row and log
    line: not empty, without whitespace or ``/``, not starting with ``-`` (an option)."""
    if not name or name.startswith("-") or "/" in name or any(c.isspace() for c in name):
        raise ConfigError(
            f"{path}: {kind} {name!r}: not a usable name: it must be one word (no spaces or '/', not empty, "
            "not starting with '-'): it is typed on the command line and labels every table, log line and metric",
            hint=f"rename the {kind} (e.g. blackwell-1; the address stays as it is)",
        )


def _validate_host(path: Path, name: str, spec: Any, defaults: dict[str, Any]) -> Host:
    _check_name(path, "host", name)
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: host {name!r}: settings must be a mapping with at least 'address'")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ConfigError(
            f"{path}: host {name[:40]!r}...: the name is too long: at most {MAX_NAME_BYTES} bytes in UTF-8 "
            "(a letter or digit counts 1, a non-ASCII character 2-4); it labels every table, log line and metric",
            hint="use a shorter name (the address stays as it is)",
        )
    try:
        return Host.model_validate({**defaults, **spec, "name": name})
    except ValidationError as exc:
        raise ConfigError(_describe(path, f"host {name!r}", exc)) from None


def _validate_gateway(path: Path, raw: Any, hosts: dict[str, Host]) -> Gateway:
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: 'gateway' must be a mapping with 'url' "
            "(and optional 'api_key_env', 'host', 'python', 'env', 'args')"
        )
    try:
        gateway = Gateway.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(path, "gateway", exc, Gateway)) from None
    if gateway.host is not None and gateway.host not in hosts:
        raise ConfigError(
            f"{path}: gateway, key 'host': {gateway.host!r} is not a host of the inventory; "
            f"known hosts: {', '.join(hosts)}",
            hint="name the inventory host that runs smg, or leave 'host' out if the gateway runs elsewhere",
        )
    if gateway.metrics > 65535:
        raise ConfigError(
            f"{path}: gateway, key 'url': smg's metrics port would be {gateway.metrics} (the gateway's port + 1), "
            "not a TCP port",
            hint="set gateway.metrics_port to a free port, or give the gateway a lower port",
        )
    taken = {gateway.port: "the gateway's own port"}
    if gateway.host is not None:
        taken[hosts[gateway.host].server_port] = f"the server_port of {gateway.host}, where smg runs"
    if gateway.metrics in taken:
        key = "metrics_port" if gateway.metrics_port else "url"
        raise ConfigError(
            f"{path}: gateway, key {key!r}: smg's metrics port {gateway.metrics} is {taken[gateway.metrics]}",
            hint="set gateway.metrics_port to a free port (by default it is the gateway's port + 1)",
        )
    return gateway


def _validate_groups(path: Path, raw: Any, hosts: dict[str, Host]) -> dict[str, ReplicaGroup]:
    """``groups:``: each a valid ``ReplicaGroup`` of known hosts, no host in two groups, no group named as
    a host, and hosts that agree on what every rank must share (``GROUP_ALIKE_KEYS``)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: 'groups' must be a mapping of group names to {{hosts: [...], playbook: NAME}}")
    groups: dict[str, ReplicaGroup] = {}
    member_of: dict[str, str] = {}
    for name, spec in raw.items():
        group = _validate_group(path, str(name), spec, hosts)
        for host in group.hosts:
            if host in member_of:
                raise ConfigError(
                    f"{path}: group {group.name!r}, key 'hosts': {host!r} is already in group {member_of[host]!r}; "
                    "a host runs one rank of one server",
                    hint="list each host in one group only",
                )
            member_of[host] = group.name
        groups[group.name] = group
    return groups


def _validate_group(path: Path, name: str, spec: Any, hosts: dict[str, Host]) -> ReplicaGroup:
    where = f"group {name!r}"
    _check_name(path, "group", name)
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: {where}: settings must be a mapping with 'hosts' and 'playbook'")
    if name in hosts:
        raise ConfigError(
            f"{path}: {where}: a host has that name too; a group and a host may not share a name",
            hint="rename the group",
        )
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ConfigError(f"{path}: group {name[:40]!r}...: the name is too long (at most {MAX_NAME_BYTES} bytes)")
    try:
        group = ReplicaGroup.model_validate({**spec, "name": name})
    except ValidationError as exc:
        raise ConfigError(_describe(path, where, exc, ReplicaGroup)) from None
    unknown = next((h for h in group.hosts if h not in hosts), None)
    if unknown is not None:
        raise ConfigError(
            f"{path}: {where}, key 'hosts': {unknown!r} is not a host of the inventory; "
            f"known hosts: {', '.join(hosts)}",
            hint="list hosts by their names under 'hosts:'",
        )
    _refuse_unlike_hosts(path, group, hosts)
    return group


def _refuse_unlike_hosts(path: Path, group: ReplicaGroup, hosts: dict[str, Host]) -> None:
    """Every rank runs the same arguments on the same number of GPUs: the group's hosts must agree on
    ``gpus`` and ``model_path``. (The GPU model is not in the inventory: it is read on the hosts.)"""
    for key in GROUP_ALIKE_KEYS:
        values = {h: getattr(hosts[h], key) for h in group.hosts}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{h}: {v}" for h, v in values.items())
            raise ConfigError(
                f"{path}: group {group.name!r}, key 'hosts': its hosts differ in {key!r} ({listed}); "
                "every rank of a group runs the same server arguments",
                hint=f"give the group's hosts the same {key}",
            )


def _with_group_playbooks(
    path: Path, hosts: dict[str, Host], hosts_raw: dict[Any, Any], groups: dict[str, ReplicaGroup]
) -> dict[str, Host]:
    """The hosts, each group's members with the group's playbook as their default (over ``defaults:``);
    a member naming another playbook itself is exit 2: the ranks of one server serve one recipe."""
    merged = dict(hosts)
    for group in groups.values():
        for name in group.hosts:
            own = (hosts_raw.get(name) or {}).get("playbook")
            if own is not None and own != group.playbook:
                raise ConfigError(
                    f"{path}: host {name!r}, key 'playbook': {own!r}, but the host is in group {group.name!r}, "
                    f"which serves {group.playbook!r}",
                    hint="leave 'playbook' out of the host (the group's applies) or make them the same",
                )
            merged[name] = hosts[name].model_copy(update={"playbook": group.playbook})
    return merged


def _describe(path: Path, where: str, exc: ValidationError, model: type[BaseModel] = Host) -> str:
    """One line per problem: file, host, key, what is wrong."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "?"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(k for k in model.model_fields if k != "name")
            close = did_you_mean(str(err["loc"][-1]), model, err["loc"][:-1])
            typo = f" (did you mean {close!r}?)" if close else ""
            lines.append(f"{path}: {where}: unknown key {key!r}{typo} (allowed: {allowed})")
        elif err["type"] == "missing":
            lines.append(f"{path}: {where}: missing required key {key!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = "" if err["loc"][:1] in (("env",), ("args",)) else f" (got {err.get('input')!r})"  # may hold a secret
            got = "" if got[1:] in msg else got  # the validator's own message already says it
            lines.append(f"{path}: {where}, key {key!r}: {msg}{got}")
    return "\n".join(lines)
