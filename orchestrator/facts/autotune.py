"""FlashInfer's autotune cache as orch manages it: which hosts may share one, where it lives, what its log says.

SGLang runs FlashInfer's MoE autotune at launch unless ``--disable-flashinfer-autotune`` (reference
sglang.md §6.2) and caches the result under ``$SGLANG_CACHE_DIR/flashinfer/autotune/<flashinfer
version>/sm<major><minor>/<key>/rank_tp{r}_pp{p}_dp{d}.json``, the key hashing the model path, dtype,
quantization, MoE runner backend, the parallel sizes and the model class. orch sets ``SGLANG_CACHE_DIR``
to a directory of its own on each host (``cache_dir``) and never computes SGLang's key: hosts that agree
on everything the key and the path are made of (``GroupKey``) share one cache, and the producer's own
log line ``Running FlashInfer autotune with cache: <path>`` says which directory that is. Reuse shows in
the next host's log as FlashInfer's ``[Autotuner]: Loaded N configs from <path>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.facts import server as server_facts
from orchestrator.recipe import Recipe

CACHE_ENV = "SGLANG_CACHE_DIR"
DISABLE_FLAG = "disable-flashinfer-autotune"
VERSION_SNIPPET = "import flashinfer; print(flashinfer.__version__)"
"""What SGLang puts in the path (``flashinfer.__version__``), read by the host's python the same way."""

_RUNNING = re.compile(r"Running FlashInfer autotune with cache: (\S+)")
_LOADED = re.compile(r"\[Autotuner\]: Loaded (\d+) configs from (\S+)")
_RANK_FILE = re.compile(r"^rank_tp\d+_pp\d+_dp\d+(_gpu[\w-]+)?\.json$")


def enabled(recipe: Recipe) -> bool:
    """Whether the recipe lets SGLang run FlashInfer's autotune at launch (the flag absent or false)."""
    return recipe.server_args.get(DISABLE_FLAG) is not True


def cache_dir(workdir: str) -> str:
    """The ``SGLANG_CACHE_DIR`` orch gives its server on a host: under orch's workdir, orch's own."""
    return f"{workdir.rstrip('/')}/sglang-cache"


def launch_env(recipe: Recipe, workdir: str) -> dict[str, str]:
    """The server job's environment for the autotune: ``SGLANG_CACHE_DIR`` when the recipe runs it, else
    nothing (SGLang's JIT caches also live under that directory: a launch without the autotune keeps the
    default ``~/.cache/sglang`` and what it already compiled)."""
    return {CACHE_ENV: cache_dir(workdir)} if enabled(recipe) else {}


def version_argv(python: str) -> list[str]:
    return [python, "-c", VERSION_SNIPPET]


def parse_version(stdout: str) -> str | None:
    """``0.6.14`` from the snippet's output; None for anything but one word."""
    words = stdout.split()
    return words[0] if len(words) == 1 else None


@dataclass(frozen=True)
class GroupKey:
    """What two hosts must share for one's autotune cache to be the other's: the GPU (name and compute
    capability: the ``sm`` in the path), the SGLang commit, the FlashInfer version, the model path, the
    parallel sizes, the MoE runner backend and the ops the autotune skips (as the recipe asks them)."""

    gpu: str
    compute_cap: str
    commit: str
    flashinfer: str
    model_path: str
    tp: int
    pp: int
    attn_dp: int
    ep: int
    moe_runner_backend: str
    skip_ops: str = ""


def group_key(recipe: Recipe, model_path: str, gpu: str, compute_cap: str, commit: str, flashinfer: str) -> GroupKey:
    """The key of a host serving ``recipe`` (its facts given)."""
    args = recipe.server_args
    return GroupKey(
        gpu=gpu,
        compute_cap=compute_cap,
        commit=commit,
        flashinfer=flashinfer,
        model_path=model_path,
        tp=server_facts.recipe_tp_size(recipe, 1),
        pp=server_facts.int_arg(args, ("pp-size", "pipeline-parallel-size"), 1),
        attn_dp=server_facts.attention_dp(recipe),
        ep=server_facts.int_arg(args, ("ep-size", "expert-parallel-size", "ep"), 1),
        moe_runner_backend=str(args.get("moe-runner-backend", "auto")),
        skip_ops=" ".join(sorted(str(args.get("flashinfer-autotune-skip-ops", "")).split())),
    )


@dataclass(frozen=True)
class Group:
    """Hosts with one key: ``producer`` launches first and tunes; ``followers`` get its cache, then launch."""

    producer: str
    followers: tuple[str, ...]


def groups(keys: Mapping[str, GroupKey | None]) -> list[Group]:
    """Hosts (in the given order) grouped by key; the first host of a group produces. A host without a
    key (autotune off, or its facts unreadable) is in no group: it serves as it would anyway."""
    members: dict[GroupKey, list[str]] = {}
    for host, key in keys.items():
        if key is not None:
            members.setdefault(key, []).append(host)
    return [Group(hosts[0], tuple(hosts[1:])) for hosts in members.values()]


@dataclass(frozen=True)
class AutotuneLog:
    """What a server's log says of the autotune: the cache file first named (every TP rank names its own
    file in one directory) and, on cache hits, each file FlashInfer loaded with its count of configs."""

    cache_file: str | None = None
    loaded: tuple[tuple[str, int], ...] = ()


def parse_log(text: str) -> AutotuneLog:
    running = _RUNNING.search(text)
    hits = tuple((m.group(2), int(m.group(1))) for m in _LOADED.finditer(text))
    return AutotuneLog(cache_file=running.group(1) if running else None, loaded=hits)


def key_dir(cache_file: str, root: str) -> str | None:
    """The cache directory (``flashinfer/autotune/<version>/<arch>/<key>``, relative to ``root``) of the
    file the log names; None when it is not under ``root`` (not orch's cache: nothing to share)."""
    prefix = root.rstrip("/") + "/"
    if not cache_file.startswith(prefix) or ".." in cache_file.split("/"):
        return None
    relative = cache_file[len(prefix) :]
    parts = relative.split("/")
    if len(parts) != 6 or parts[:2] != ["flashinfer", "autotune"]:
        return None
    return "/".join(parts[:5])


def is_rank_file(name: str) -> bool:
    """A per-rank cache file (``rank_tp0_pp0_dp0.json``): what is copied; never ``runs/`` or anything else."""
    return bool(_RANK_FILE.match(name))


def list_argv(directory: str) -> list[str]:
    """The regular files directly in ``directory`` (one name per line; symlinks are not listed)."""
    return ["find", directory, "-maxdepth", "1", "-type", "f", "-printf", "%f\\n"]


def path_prefixes(workdir: str, key_dir: str) -> list[str]:
    """Every directory from orch's cache root down to the key directory: none may be a symbolic link
    (orch writes there; it never follows a link it did not make)."""
    path, prefixes = cache_dir(workdir), [cache_dir(workdir)]
    for part in key_dir.split("/"):
        path = f"{path}/{part}"
        prefixes.append(path)
    return prefixes


def symlink_argv(paths: list[str]) -> list[str]:
    """Prints the first of ``paths`` that is a symbolic link and exits 1; exits 0 when none is."""
    script = 'for p; do if [ -L "$p" ]; then printf "%s\\n" "$p"; exit 1; fi; done'
    return ["sh", "-c", script, "orch-no-symlink", *paths]


def sha256_argv(directory: str, names: list[str]) -> list[str]:
    return ["sh", "-c", 'cd -- "$1" && shift && sha256sum -- "$@"', "orch-sha256", directory, *names]


def parse_sha256sum(stdout: str) -> dict[str, str]:
    """``{name: hex digest}`` from ``sha256sum`` output."""
    sums = {}
    for line in stdout.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            sums[name] = digest
    return sums


def loaded_from(log: AutotuneLog, directory: str) -> int | None:
    """How many configs the server loaded from a file of ``directory`` (the first such line); None when
    its log shows no cache hit there: it tuned, or loaded another cache."""
    return next((n for path, n in log.loaded if path.rsplit("/", 1)[0] == directory.rstrip("/") and n > 0), None)
