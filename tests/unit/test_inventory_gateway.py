"""hosts.yaml ``gateway:`` (issue 12): optional, validated like the rest, exit 2 naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, ExitCode
from orchestrator.inventory import load_inventory

HOSTS = "hosts:\n  a:\n    address: 127.0.0.2\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


def test_gateway_is_optional(tmp_path: Path) -> None:
    assert load_inventory(write(tmp_path, HOSTS)).gateway is None


def test_gateway_loads_url_key_variable_and_host(tmp_path: Path) -> None:
    text = HOSTS + "gateway:\n  url: http://127.0.0.2:30080\n  api_key_env: ORCH_GATEWAY_KEY\n  host: a\n"
    gateway = load_inventory(write(tmp_path, text)).gateway
    assert gateway is not None
    assert (gateway.url, gateway.api_key_env, gateway.host) == ("http://127.0.0.2:30080", "ORCH_GATEWAY_KEY", "a")
    assert (gateway.bind_address, gateway.port) == ("127.0.0.2", 30080)


@pytest.mark.parametrize("url", ["http://127.0.0.2:30080/", "http://[::1]:30080/"])
def test_a_trailing_slash_in_the_gateway_url_is_the_same_url(tmp_path: Path, url: str) -> None:
    # `url: http://127.0.0.1:30080/` crashed every command with a ValueError on '30080/'
    gateway = load_inventory(write(tmp_path, HOSTS + f"gateway:\n  url: {url}\n")).gateway
    assert gateway is not None
    assert (gateway.url, gateway.port, gateway.metrics) == (url.removesuffix("/"), 30080, 30081)
    assert gateway.bind_address == url.split("//")[1].rsplit(":", 1)[0].strip("[]")


@pytest.mark.parametrize(
    ("gateway", "expected"),
    [
        ("gateway: http://h:1\n", "'gateway' must be a mapping"),
        ("gateway:\n  host: a\n", "gateway: missing required key 'url'"),
        ("gateway:\n  url: h:30080\n", "gateway, key 'url': must be http://HOST:PORT"),
        ("gateway:\n  url: http://user:pw@h:30080\n", "gateway, key 'url': must be http://HOST:PORT"),
        ("gateway:\n  url: http://h:30080/v1\n", "gateway, key 'url': must be http://HOST:PORT"),
        ("gateway:\n  url: http://h:0\n", "gateway, key 'url': port 0 is not a TCP port (1-65535)"),
        ("gateway:\n  url: http://h:65536/\n", "gateway, key 'url': port 65536 is not a TCP port (1-65535)"),
        ("gateway:\n  url: http://h:99999\n", "gateway, key 'url': port 99999 is not a TCP port (1-65535)"),
        ("gateway:\n  url: http://h:65535\n", "gateway, key 'url': smg's metrics port would be 65536"),
        (
            "gateway:\n  url: http://h:1\n  api_key: s3cret\n",
            "gateway: unknown key 'api_key' (did you mean 'api_key_env'?) (allowed",
        ),
        ("gateway:\n  url: http://h:1\n  api_key_env: 'MY-KEY'\n", "gateway, key 'api_key_env': 'MY-KEY' is not"),
        ("gateway:\n  url: http://h:1\n  host: b\n", "gateway, key 'host': 'b' is not a host of the inventory"),
        ('gateway:\n  url: "http://h:1\\n"\n', "gateway, key 'url': holds"),
        ("gateway:\n  url: http://h:29999\n  host: a\n", "gateway, key 'url': smg's metrics port 30000 is the serv"),
    ],
)
def test_bad_gateway_names_file_and_key(tmp_path: Path, gateway: str, expected: str) -> None:
    path = write(tmp_path, HOSTS + gateway)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE


def test_secret_value_never_echoed(tmp_path: Path) -> None:
    """A key written in the file by mistake is refused by its name; the value is not repeated."""
    path = write(tmp_path, HOSTS + "gateway:\n  url: http://h:1\n  api_key: s3cret-value\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert "s3cret-value" not in str(info.value)


def test_gateway_job_settings_default_to_python3_and_nothing_extra(tmp_path: Path) -> None:
    gateway = load_inventory(write(tmp_path, HOSTS + "gateway:\n  url: http://h:1\n  host: a\n")).gateway
    assert gateway is not None
    assert (gateway.python, gateway.env, gateway.args) == ("python3", {}, [])


def test_gateway_job_settings_load(tmp_path: Path) -> None:
    text = HOSTS + (
        "gateway:\n  url: http://h:1\n  host: a\n  python: /opt/smg/bin/python\n"
        "  env: {HF_ENDPOINT: 'http://127.0.0.1:9'}\n  args: [--policy, round_robin]\n"
    )
    gateway = load_inventory(write(tmp_path, text)).gateway
    assert gateway is not None
    assert gateway.python == "/opt/smg/bin/python"
    assert gateway.env == {"HF_ENDPOINT": "http://127.0.0.1:9"}
    assert gateway.args == ["--policy", "round_robin"]
    assert gateway.metrics == 2  # the gateway's port + 1 when metrics_port is not set


def test_gateway_metrics_port_loads(tmp_path: Path) -> None:
    gateway = load_inventory(write(tmp_path, HOSTS + "gateway:\n  url: http://h:1\n  metrics_port: 9100\n")).gateway
    assert gateway is not None
    assert (gateway.metrics_port, gateway.metrics) == (9100, 9100)


GATEWAY = "gateway:\n  url: http://h:1\n  host: a\n"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("  python: bin/python\n", "gateway, key 'python': must be an absolute path on the gateway host"),
        ("  python: ~/venv/bin/python\n", "gateway, key 'python': must be an absolute path"),
        ("  python: -c\n", "gateway, key 'python': must be an absolute path"),
        ("  env: {HF-ENDPOINT: x}\n", "gateway, key 'env': 'HF-ENDPOINT' is not an environment variable name"),
        ("  env: {HF_TOKEN: hf_x}\n", "gateway, key 'env': looks like a secret"),
        ("  env: {MODE: 'password=x'}\n", "gateway, key 'env': looks like a secret"),
        ("  env: [HF_ENDPOINT]\n", "gateway, key 'env': Input should be a valid dictionary"),
        ("  args: --policy round_robin\n", "gateway, key 'args': Input should be a valid list"),
        ("  args: [--port, '8080']\n", "gateway, key 'args': --port is set by orch"),
        ("  args: ['--worker-urls=http://x:1']\n", "gateway, key 'args': --worker-urls is set by orch"),
        ("  args: [--api-key, s3cret-value]\n", "gateway, key 'args': --api-key is set by orch"),
        ("  args: [--policy, '--token=s3cret-value']\n", "gateway, key 'args': looks like a secret ('token=')"),
        ('  args: ["--policy\\n"]\n', "gateway, key 'args[0]': holds"),
        ("  metrics_port: 0\n", "gateway, key 'metrics_port': Input should be greater than or equal to 1"),
        ("  metrics_port: 1\n", "gateway, key 'metrics_port': smg's metrics port 1 is the gateway's own port"),
        ("  metrics_port: 30000\n", "key 'metrics_port': smg's metrics port 30000 is the server_port of a, where"),
    ],
)
def test_bad_gateway_job_setting_names_file_and_key(tmp_path: Path, extra: str, expected: str) -> None:
    path = write(tmp_path, HOSTS + GATEWAY + extra)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)
    assert "s3cret-value" not in str(info.value) and "hf_x" not in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE
