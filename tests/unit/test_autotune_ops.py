"""Sharing a FlashInfer autotune cache between hosts: the copy checked by sha256, the reuse read from the log."""

from __future__ import annotations

import hashlib
from pathlib import Path

from orchestrator.facts import autotune as at
from orchestrator.inventory import Host
from orchestrator.ops import autotune as op
from orchestrator.ops.serve import ServeResult
from orchestrator.session import HostSession
from orchestrator.store import StateStore
from tests.fakerunner import FakeRunner

HOST = Host(name="b2", address="10.0.0.2", workdir="/root/.orch")
ROOT = "/root/.orch/sglang-cache"
KEY_DIR = "flashinfer/autotune/0.6.14/sm120/63cbe409ac8f56ff"
FILES = {"rank_tp0_pp0_dp0.json": b'{"a": 1}', "rank_tp1_pp0_dp0.json": b'{"a": 2}'}
CACHE = op.SharedCache("b1", KEY_DIR, FILES, {n: hashlib.sha256(d).hexdigest() for n, d in FILES.items()})


def follower(runner: FakeRunner, tmp_path: Path) -> tuple[HostSession, list[object]]:
    said: list[object] = []
    return HostSession(HOST, runner, StateStore(tmp_path / "state.json"), said.append), said


def sums(changed: str | None = None) -> str:
    return "".join(f"{'0' * 64 if n == changed else CACHE.sums[n]}  {n}\n" for n in sorted(FILES))


def served(job_id: str = "server-1") -> ServeResult:
    return ServeResult(argv=["sglang"], job_id=job_id, mtp=False, healthy_after=1.0)


def test_the_copied_files_are_checked_by_the_hosts_sha256sum(tmp_path: Path) -> None:
    runner = FakeRunner("b2").on(("orch-no-symlink",)).on(("mkdir",)).on(("orch-sha256",), stdout=sums())
    session, said = follower(runner, tmp_path)
    assert op.place(session, CACHE)
    assert {p: d for p, d in runner.files.items()} == {f"{ROOT}/{KEY_DIR}/{n}": d for n, d in FILES.items()}
    assert runner.commands()[-1] == f"orch-sha256 {ROOT}/{KEY_DIR} rank_tp0_pp0_dp0.json rank_tp1_pp0_dp0.json"
    assert said == ["FlashInfer autotune: copied 2 cache files from b1 (sha256 checked)"]


def test_a_copied_file_that_differs_is_removed_so_the_server_tunes_rather_than_load_it(tmp_path: Path) -> None:
    runner = FakeRunner("b2").on(("orch-no-symlink",)).on(("mkdir",)).on(("rm",))
    runner.on(("orch-sha256",), stdout=sums("rank_tp1_pp0_dp0.json"))
    session, said = follower(runner, tmp_path)
    assert not op.place(session, CACHE)
    assert runner.commands()[-1] == f"rm -f -- {ROOT}/{KEY_DIR}/rank_tp1_pp0_dp0.json"
    assert said[0] == "WARNING: FlashInfer autotune: 1 copied files differ from b1's; removed"


def test_a_symbolic_link_on_the_way_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    runner = FakeRunner("b2").on(("orch-no-symlink",), stdout=f"{ROOT}/flashinfer\n", exit_status=1)
    session, said = follower(runner, tmp_path)
    assert not op.place(session, CACHE) and runner.files == {}
    assert runner.commands()[0].startswith(f"orch-no-symlink {ROOT} {ROOT}/flashinfer {ROOT}/flashinfer/autotune ")
    assert said == [
        "WARNING: FlashInfer autotune: could not copy b1's cache here: "
        f"b2: {ROOT}/flashinfer is a symbolic link; orch does not follow it"
    ]


def test_reuse_is_read_from_flashinfers_load_line_for_the_copied_file(tmp_path: Path) -> None:
    path = f"{ROOT}/{KEY_DIR}/rank_tp0_pp0_dp0.json"
    runner = FakeRunner("b2")
    runner.files["/root/.orch/jobs/server-1/log"] = (
        f"[2026-12-03 12:56:41 TP0] Running FlashInfer autotune with cache: {path}\n"
        f"2026-12-03 12:56:41,002 - INFO - autotuner.py - flashinfer.jit: [Autotuner]: Loaded 26 configs from {path}\n"
    ).encode()
    runner.files["/root/.orch/jobs/server-2/log"] = (
        f"[2026-12-03 12:56:41 TP0] Running FlashInfer autotune with cache: {path}\n"
        "2026-12-03 12:56:41,002 - INFO - autotuner.py - flashinfer.jit: [Autotuner]: Autotuning process starts ...\n"
    ).encode()
    session, _ = follower(runner, tmp_path)
    hit, tuned = served("server-1"), served("server-2")
    op.check_reuse(session, hit, CACHE)
    op.check_reuse(session, tuned, CACHE)
    assert hit.autotune == f"reused the cache b1 produced (26 configs loaded from {KEY_DIR})" and not hit.warnings
    assert tuned.warnings == [
        "FlashInfer autotune: the server did not load the cache copied from b1 (its log shows no cache hit)"
    ]


def test_without_a_cache_from_its_producer_a_host_serves_and_tunes_its_own(tmp_path: Path) -> None:
    session, said = follower(FakeRunner("b2"), tmp_path)
    result = op.follow(session, None, "b1", lambda s: served())
    assert result.job_id == "server-1" and result.autotune == ""
    assert said == ["FlashInfer autotune: no cache to reuse from b1; this server tunes its own"]


def test_the_producer_shares_only_the_cache_of_orchs_directory_its_log_names(tmp_path: Path) -> None:
    runner = FakeRunner("b1")
    runner.files["/root/.orch/jobs/server-1/log"] = (
        b"[2026-12-03 12:56:41 TP0] Running FlashInfer autotune with cache: "
        b"/root/.cache/sglang/flashinfer/autotune/0.6.14/sm120/63cbe409ac8f56ff/rank_tp0_pp0_dp0.json\n"
    )
    session = HostSession(
        Host(name="b1", address="10.0.0.1", workdir="/root/.orch"), runner, StateStore(tmp_path / "s")
    )
    cache, why = op.read_produced(session, served())
    assert cache is None and why == "no FlashInfer autotune cache of orch's in the server's log"
    assert at.cache_dir("/root/.orch") == ROOT
