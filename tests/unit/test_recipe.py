"""``orchestrator.recipe``: a playbook is refused as the user wrote it, with the bounds of the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.recipe import load_recipe


def playbook_error(tmp_path: Path, text: str) -> ConfigError:
    """The error of loading a playbook of a model, an architecture and ``text``: it must be refused."""
    path = tmp_path / "p.yaml"
    path.write_text("model: M\narchitecture: A\n" + text)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    return info.value


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("min_accept_length: -1\n", "min_accept_length"),
        ("profiles:\n  low:\n    min_accept_length: -0.5\n", "profiles.low.min_accept_length"),
    ],
)
def test_a_negative_min_accept_length_is_refused_as_serve_min_accept_is(tmp_path: Path, text: str, key: str) -> None:
    error = playbook_error(tmp_path, text)
    assert f"{tmp_path / 'p.yaml'}: key {key!r}: Input should be greater than or equal to 0" in str(error)
    assert error.exit_code == ExitCode.USAGE
