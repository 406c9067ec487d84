"""Issue 13 (secrets leak): env values travel on a remote shell's stdin, never in its command string;
commands shown to people redact values whose names look secret."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator import jobs
from orchestrator.errors import UsageError
from orchestrator.transport.base import remote_command, shell_command

HOSTILE = " $(touch pwned) `id` 'q' \"d\" \\ ;x "


def test_remote_command_keeps_values_off_the_command_and_exports_them_literally() -> None:
    env = {"HF_TOKEN": "hf_abc123", "ODD": HOSTILE}
    command, env_lines = remote_command(["sh", "-c", 'printf "%s|%s|" "$HF_TOKEN" "$ODD"; cat'], cwd="/", env=env)
    assert "hf_abc123" not in command and "pwned" not in command
    out = subprocess.run(["sh", "-c", command], input=env_lines + "rest\n", capture_output=True, text=True, check=True)
    assert out.stdout == f"hf_abc123|{HOSTILE}|rest\n"


def test_remote_command_refuses_a_multi_line_value_naming_the_key() -> None:
    with pytest.raises(UsageError, match="environment variable PEM: its value has a newline"):
        remote_command(["true"], env={"PEM": "a\nb"})


def test_shown_commands_redact_secret_looking_values_only() -> None:
    shown = shell_command(["x"], env={"OPENAI_API_KEY": "sk-1", "DB_PASSWORD": "p", "CUDA_VISIBLE_DEVICES": "3"})
    assert shown == "env OPENAI_API_KEY=<redacted> DB_PASSWORD=<redacted> CUDA_VISIBLE_DEVICES=3 x"


def test_a_job_refuses_a_secret_in_its_own_env_which_is_on_its_command_line() -> None:
    spec = jobs.JobSpec("t", "t.x", ["true"], env={"HF_TOKEN": "hf_1"})
    with pytest.raises(UsageError, match="job environment HF_TOKEN: looks like a secret"):
        jobs.start_argv("/w", "j1", spec)
