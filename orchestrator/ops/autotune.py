"""``orch serve`` with FlashInfer's autotune on: the fleet pays for it once per group of identical hosts.

The server job gets ``SGLANG_CACHE_DIR`` under orch's workdir (``facts.autotune.launch_env``, set by
``ops.serve.launch``). Serving several hosts (``serve_fleet``):

1. Each host's key (``facts.autotune.GroupKey``: GPU, SGLang commit, FlashInfer version read on the host,
   model path, parallel sizes, MoE runner backend) is read; hosts with equal keys form a group, its first
   host the producer. A host whose recipe disables the autotune, or whose facts cannot be read, is in no
   group and serves as it would anyway.
2. Every host but the groups' followers is served (in parallel, as ``orch serve`` does).
3. From each producer that serves, the cache its log names (``Running FlashInfer autotune with cache:``)
   is read: the per-rank files of that directory, checked against the producer's own ``sha256sum``.
4. Each follower gets the files at the same place under its own cache directory, checked by its
   ``sha256sum`` (a mismatched file is removed: the server tunes again rather than load it), then is
   served; its log must show FlashInfer loading the copied file (``[Autotuner]: Loaded N configs from``),
   else the result carries a warning.

A producer that fails leaves its followers to tune for themselves (said on each). ``orch run`` and
``serve --rolling`` set the cache directory too, but each host tunes its own (no ordering across hosts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.errors import OrchError, RefusedError, RemoteCommandError
from orchestrator.facts import autotune as at
from orchestrator.facts import server as server_facts
from orchestrator.fleet import Fleet, FleetResult, HostResult
from orchestrator.inventory import Host
from orchestrator.ops.serve import ServeResult
from orchestrator.recipe import Recipe
from orchestrator.session import HostSession
from orchestrator.store import StateStore

ServeOne = Callable[[HostSession], ServeResult]


@dataclass(frozen=True)
class SharedCache:
    """A producer's cache: its directory (relative to the cache root) and each rank file's bytes and sha256."""

    producer: str
    key_dir: str
    files: dict[str, bytes]
    sums: dict[str, str]


def serve_fleet(
    fleet: Fleet, hosts: list[Host], recipes: dict[str, Recipe], serve_one: ServeOne, store: Callable[[], StateStore]
) -> FleetResult[ServeResult]:
    """Serve ``hosts``, producers before their followers (the flow in the module docstring)."""
    if len(hosts) < 2:  # nothing to share: no fact read for it (importing flashinfer takes seconds)
        return fleet.map_sessions(serve_one, store, hosts)
    keys = fleet.map_sessions(lambda s: host_key(s, recipes[s.name]), store, hosts)
    shared = [g for g in at.groups({r.host.name: r.value for r in keys if r.ok}) if g.followers]
    if not shared:
        return fleet.map_sessions(serve_one, store, hosts)
    later = {f: g for g in shared for f in g.followers}
    first = fleet.map_sessions(serve_one, store, [h for h in hosts if h.name not in later])
    done = {r.host.name: r for r in first}
    caches = {g.producer: produced(fleet.session(done[g.producer].host, store()), done[g.producer], g) for g in shared}
    rest = fleet.map_sessions(
        lambda s: follow(s, caches[later[s.name].producer], later[s.name].producer, serve_one),
        store,
        [h for h in hosts if h.name in later],
    )
    order = [h.name for h in hosts]
    return FleetResult(sorted([*first, *rest], key=lambda r: order.index(r.host.name)))


def host_key(session: HostSession, recipe: Recipe) -> at.GroupKey | None:
    """The host's group key, or None when the recipe disables the autotune or a fact is missing."""
    if not at.enabled(recipe):
        return None
    gpus = session.gpus(server_facts.server_gpus(recipe, session.host))
    version = flashinfer_version(session)
    if not (gpus.device and gpus.compute_cap and version):
        return None
    commit = session.git().commit
    return at.group_key(recipe, session.host.model_path, gpus.device, gpus.compute_cap, commit, version)


def flashinfer_version(session: HostSession) -> str | None:
    """``flashinfer.__version__`` as the host's python imports it (None when it does not)."""

    def read() -> str | None:
        result = session.runner.run(at.version_argv(session.host.python), timeout=120)
        return at.parse_version(result.stdout) if result.ok else None

    return session.fact("flashinfer_version", read)


def produced(session: HostSession, served: HostResult[ServeResult], group: at.Group) -> SharedCache | None:
    """The cache the producer's server names in its log, read with its sha256; None when it does not
    serve or shares nothing (its report says why). A server serving but not as asked (exit 5) still shares."""
    result = served.value if served.ok else getattr(served.error, "result", None)
    if not isinstance(result, ServeResult):
        return None
    try:
        cache, how = read_produced(session, result)
    except OrchError as exc:
        cache, how = None, f"its cache could not be read to share: {exc}"
    if cache is None:
        result.autotune = f"{how}; {', '.join(group.followers)} tune their own"
        return None
    result.autotune = f"{how} ({len(cache.files)} files in {cache.key_dir}); shared with {', '.join(group.followers)}"
    session.say(f"FlashInfer autotune: {result.autotune}")
    return cache


def read_produced(session: HostSession, result: ServeResult) -> tuple[SharedCache | None, str]:
    """The cache named in the server's log (None when none of orch's or no rank file) and what the server
    did: tuned, or reused a cache it already had."""
    log = at.parse_log(log_text(session, result.job_id))
    root = at.cache_dir(session.host.workdir)
    key_dir = at.key_dir(log.cache_file, root) if log.cache_file else None
    if key_dir is None:
        return None, "no FlashInfer autotune cache of orch's in the server's log"
    cache = read_cache(session, root, key_dir)
    if not cache.files:
        return None, f"no cache files in {key_dir}"
    reused = at.loaded_from(log, f"{root}/{key_dir}") is not None
    return cache, "reused its cache" if reused else "tuned"


def log_text(session: HostSession, job_id: str) -> str:
    """The server job's log so far (the session's reader: only new bytes are read)."""
    reader = session.log(job_id)
    reader.read()
    return reader.text


def read_cache(session: HostSession, root: str, key_dir: str) -> SharedCache:
    """The rank files of ``root/key_dir`` on the producer, each read and checked against its sha256sum."""
    directory = f"{root}/{key_dir}"
    runner = session.runner
    refuse_links(session, key_dir)
    names = sorted(n for n in runner.run(at.list_argv(directory), check=True).stdout.splitlines() if at.is_rank_file(n))
    sums = at.parse_sha256sum(runner.run(at.sha256_argv(directory, names), check=True).stdout) if names else {}
    files = {n: runner.read_bytes(f"{directory}/{n}") for n in names}
    for name, data in files.items():
        if hashlib.sha256(data).hexdigest() != sums.get(name):
            raise RemoteCommandError(f"{session.name}: {directory}/{name} changed while orch read it", exit_status=1)
    return SharedCache(session.name, key_dir, files, sums)


def follow(session: HostSession, cache: SharedCache | None, producer: str, serve_one: ServeOne) -> ServeResult:
    """Copy the producer's cache here (checked), serve, and check the server loaded it."""
    session.forget()  # the producer's launch may have taken long: serve reads this host afresh
    if cache is None:
        session.say(f"FlashInfer autotune: no cache to reuse from {producer}; this server tunes its own")
    placed = cache is not None and place(session, cache)
    result = serve_one(session)
    if placed and cache is not None:
        check_reuse(session, result, cache)
    return result


def place(session: HostSession, cache: SharedCache) -> bool:
    """Copy ``cache`` here; False (said) when nothing usable was copied: the server then tunes its own."""
    try:
        copied = copy_cache(session, at.cache_dir(session.host.workdir), cache)
    except OrchError as exc:
        session.say(f"WARNING: FlashInfer autotune: could not copy {cache.producer}'s cache here: {exc}")
        return False
    session.say(f"FlashInfer autotune: copied {copied} cache files from {cache.producer} (sha256 checked)")
    return copied == len(cache.files)


def check_reuse(session: HostSession, result: ServeResult, cache: SharedCache) -> None:
    """The server's log must show FlashInfer loading a file of the copied directory; else a warning on the result."""
    if result.unchanged:
        result.autotune = f"not relaunched; {cache.producer}'s cache is in place for its next launch"
        return
    directory = f"{at.cache_dir(session.host.workdir)}/{cache.key_dir}"
    try:
        log = at.parse_log(log_text(session, result.job_id))
    except OrchError as exc:
        result.warnings.append(f"FlashInfer autotune: could not read the server's log to check the reuse: {exc}")
        return
    count = at.loaded_from(log, directory)
    if count is not None:
        loaded = f"{count} configs loaded from {cache.key_dir}"
        result.autotune = f"reused the cache {cache.producer} produced ({loaded})"
        session.say(f"FlashInfer autotune: {result.autotune}")
        return
    result.autotune = f"did not load the cache copied from {cache.producer}"
    result.warnings.append(f"FlashInfer autotune: the server {result.autotune} (its log shows no cache hit)")


def refuse_links(session: HostSession, key_dir: str) -> None:
    """RefusedError when a directory from orch's cache root down to ``key_dir`` is a symbolic link."""
    linked = session.runner.run(at.symlink_argv(at.path_prefixes(session.host.workdir, key_dir)))
    if not linked.ok:
        raise RefusedError(f"{session.name}: {linked.stdout.strip()} is a symbolic link; orch does not follow it")


def copy_cache(session: HostSession, root: str, cache: SharedCache) -> int:
    """Write the cache's files under ``root/key_dir`` here and compare the host's sha256sum with the
    producer's; a file that differs is removed (SGLang then tunes rather than load it). Files that match."""
    directory = f"{root}/{cache.key_dir}"
    runner = session.runner
    refuse_links(session, cache.key_dir)
    runner.run(["mkdir", "-p", "-m", "700", "--", directory], check=True)
    for name, data in cache.files.items():
        runner.write_bytes(f"{directory}/{name}", data, mode=0o644)
    names = sorted(cache.files)
    sums = at.parse_sha256sum(runner.run(at.sha256_argv(directory, names), check=True).stdout)
    bad = [n for n in names if sums.get(n) != cache.sums[n]]
    if bad:
        runner.run(["rm", "-f", "--", *(f"{directory}/{n}" for n in bad)], check=True)
        session.say(f"WARNING: FlashInfer autotune: {len(bad)} copied files differ from {cache.producer}'s; removed")
    return len(names) - len(bad)
