"""Fixtures of the conformance tier (the real SGLang package; see real.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator.inventory import Host
from orchestrator.sandbox.modelconfig import write_model
from tests.conformance.real import load_snapshot_script, orch_flag_sources, real_help_text


@pytest.fixture(scope="session")
def snapshot_script() -> ModuleType:
    """``scripts/sglang_snapshot.py``: the dump functions that made the committed snapshot."""
    return load_snapshot_script()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DeepSeek-V4-Flash ``config.json`` (the real model's dimensions; no weights)."""
    return write_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def host(model_dir: Path) -> Host:
    """A host whose model is ``model_dir``; 64 GPUs so the recipe's GPU count is never capped."""
    return Host(name="conformance", address="127.0.0.1", model_path=str(model_dir), gpus=64)


@pytest.fixture(scope="session")
def real_help() -> str:
    return real_help_text()


@pytest.fixture(scope="session")
def flag_sources(real_help: str) -> dict[str, dict[str, tuple[str, ...] | None]]:
    """Orch's known flags from each source (``parser``, ``help``), made from the real package."""
    return orch_flag_sources(real_help)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """No test of this tier is skipped: a skip (an empty parameter table, a skip mark) is a failure."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        report.outcome = "failed"
        report.longrepr = f"the conformance tier never skips a test (it was skipped: {report.longrepr})"
