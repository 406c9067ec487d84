"""``orchestrator.recipe``: a playbook is refused as the user wrote it, with the bounds of the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.recipe import PACKAGED_PLAYBOOKS, ServeOptions, find_recipe, load_recipe, parse_shapes


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


def test_a_bad_shapes_list_in_a_playbook_step_names_the_playbook_step_and_key_not_the_flag(tmp_path: Path) -> None:
    error = playbook_error(tmp_path, "steps:\n  - pull\n  - tune-fp8: {shapes: bogus}\n")
    assert str(error) == (
        f"{tmp_path / 'p.yaml'}: key 'steps.1.shapes': 'bogus' is not of the form N=1024,K=4096 "
        "(shapes separated by ';')"
    )
    assert error.exit_code == ExitCode.USAGE
    with pytest.raises(ConfigError, match=r"^--shapes: 'bogus' is not of the form N=1024,K=4096"):
        parse_shapes("bogus")  # the command line's: the flag the user typed


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("server_args:\n  tp-size: {a: 1}\n", "key 'server_args.tp-size': must be a string, number or boolean"),
        (
            "profiles:\n  low:\n    server_args: {str: [1]}\n",
            "key 'profiles.low.server_args.str': must be a string, number or boolean",
        ),
        (
            "steps:\n  - pull\n  - serve\n  - tune-fp8\n  - {bench: {}, pull: {}}\n",
            "key 'steps.3': a step is one mapping of one step name to its options; this one has 2 (bench, pull)",
        ),
        ("steps:\n  - {}\n", "key 'steps.0': a step is one mapping of one step name to its options; this one is empty"),
    ],
)
def test_a_playbook_error_is_one_line_in_the_files_own_keys(tmp_path: Path, text: str, said: str) -> None:
    """Not one line per branch of a union pydantic tried, nor the fields a step's YAML form maps to."""
    assert str(playbook_error(tmp_path, text)) == f"{tmp_path / 'p.yaml'}: {said}"


def test_a_playbook_path_with_a_slash_is_read_whatever_its_name_ends_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch run ./pb2_noext` said `no playbook './pb2_noext'` of a file that is there."""
    (tmp_path / "pb2_noext").write_text((PACKAGED_PLAYBOOKS / "deepseek-v4-flash.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    assert find_recipe("./pb2_noext", []) == Path("./pb2_noext")
    assert load_recipe(find_recipe(str(tmp_path / "pb2_noext"), [])).model == "DeepSeek-V4-Flash"
    with pytest.raises(ConfigError) as info:  # a bare name is a playbook's name: the file is said, not read
        find_recipe("pb2_noext", [])
    assert "no playbook 'pb2_noext'; known: " in str(info.value)
    assert "(a file 'pb2_noext' is here, but a name without '/' or .yaml is looked up among the playbooks)" in str(
        info.value
    )
    assert info.value.hint == "give the file as a path: ./pb2_noext"


@pytest.mark.parametrize("given", ["./nope.yaml", "nope.yml", "plays/nope"])
def test_a_playbook_path_that_does_not_exist_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """`orch run ./nope.yaml` said `no playbook './nope.yaml'; known: ...`, hint "or a path to a YAML file"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        find_recipe(given, [])
    assert info.value.message == f"no playbook file {given!r}: {tmp_path / given} does not exist"
    assert (info.value.hint or "").startswith("check the path, or give a known playbook by name: deepseek-v4-flash")
    assert info.value.exit_code == ExitCode.USAGE


def test_a_playbook_path_that_is_a_directory_is_said_to_be_one(tmp_path: Path) -> None:
    """`--playbook /some/existing/directory` said `no playbook '/some/existing/directory'; known: ...`."""
    (tmp_path / "pb").mkdir()
    for given in (str(tmp_path / "pb"), str(tmp_path / "pb") + "/"):
        with pytest.raises(ConfigError) as info:
            load_recipe(find_recipe(given, []))
        assert info.value.message == f"{tmp_path / 'pb'}: is a directory, not a YAML file"
        assert info.value.hint == "give the path of a YAML file (or a link to one)"
        assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("value", ["", " ", "tri ton", " triton"])
def test_an_fp8_gemm_backend_that_is_no_name_is_refused_before_any_host(value: str) -> None:
    # `orch serve --fp8-gemm-backend ""` relaunched a healthy server without the flag (SGLang's default backend,
    # the tuned configs unread) and then failed verification asking the server for ''
    with pytest.raises(ValidationError, match="is no backend name"):
        ServeOptions(fp8_gemm_backend=value)
    assert ServeOptions(fp8_gemm_backend="triton").fp8_gemm_backend == "triton"
