"""Issue 25 §2: FlashInfer's autotune cache is produced once and reused by a second identical host."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import FleetEnv
from tests.integration.test_serve import FAST, MakeFleet, playbook, serve_ok


def server_log(host: Any) -> str:
    (log,) = (Path(host.workdir) / "jobs").glob("server-*/log")
    return log.read_text(errors="replace")


def cache_files(host: Any) -> dict[str, str]:
    """Each rank file under orch's SGLANG_CACHE_DIR on the host (path below it → sha256)."""
    root = Path(host.workdir) / "sglang-cache"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.glob("flashinfer/autotune/*/*/*/rank_tp*_pp*_dp*.json")
    }


def test_serve_tunes_on_one_host_and_the_identical_second_host_reuses_its_cache(
    make_fleet: MakeFleet, tmp_path: Path
) -> None:
    env: FleetEnv = make_fleet(2)
    first, second = env.fleet.hosts  # type: ignore[attr-defined]
    shared_model = tmp_path / "models" / "DeepSeek-V4-Flash"  # one path on every host (a shared mount)
    shutil.copytree(first.model_path, shared_model)
    inventory = yaml.safe_load(Path(env.inventory).read_text())
    for entry in inventory["hosts"].values():
        entry["model_path"] = str(shared_model)
    Path(env.inventory).write_text(yaml.safe_dump(inventory))
    for host in (first, second):
        host.set_knobs(**FAST, autotune_seconds=0.3)
    path = playbook(tmp_path, "autotune", server_args={"disable-flashinfer-autotune": False}, fp8_gemm_backend="auto")

    run = serve_ok(env, "--playbook", path, "--no-mtp")

    produced, reused = cache_files(first), cache_files(second)
    assert len(produced) == 8 and produced == reused  # tp 8: one file per rank, the same bytes on both hosts
    (key_dir,) = {str(Path(p).parent) for p in produced}
    cache_file = f"{second.workdir}/sglang-cache/{key_dir}/rank_tp0_pp0_dp0.json"
    assert "[Autotuner]: Autotuning process starts ..." in server_log(first)
    assert "[Autotuner]: Loaded " not in server_log(first)
    assert f"Running FlashInfer autotune with cache: {cache_file}" in server_log(second)
    assert f"[Autotuner]: Loaded 26 configs from {cache_file}" in server_log(second)
    assert "Autotuning process starts" not in server_log(second)
    assert "sim-2: FlashInfer autotune: copied 8 cache files from sim-1 (sha256 checked)" in run.stderr
    assert f"  FlashInfer autotune: tuned (8 files in {key_dir}); shared with sim-2" in run.stdout
    assert f"  FlashInfer autotune: reused the cache sim-1 produced (26 configs loaded from {key_dir})" in run.stdout
