"""Pure builders and parsers: remote argv lists are quoted, host output is parsed from recorded tables."""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator.facts import git, gpus
from orchestrator.transport.base import shell_command

HOSTILE = "/tmp/a b/$(touch pwned)/`id`/;rm -rf x/'q'\"d\""


def test_shell_command_quotes_every_value() -> None:
    command = shell_command(["printf", "%s\\n", HOSTILE], cwd="/", env={"A": "$(echo no)"})
    out = subprocess.run(["sh", "-c", command + ' && echo "$A"'], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == HOSTILE


def test_shell_command_env_passes_literal_value() -> None:
    command = shell_command(["sh", "-c", 'printf %s "$A"'], env={"A": "$(echo no);`x`"})
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert out.stdout == "$(echo no);`x`"


def test_shell_command_refuses_bad_env_name() -> None:
    with pytest.raises(Exception, match="not valid"):
        shell_command(["true"], env={"A;B": "1"})


INFO = """commit=0123456789abcdef0123456789abcdef01234567
branch=main
subject=Fix: a=b in FP8 path
upstream_commit=fedcba9876543210fedcba9876543210fedcba98
behind=3
"""


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        (INFO, ("main", "Fix: a=b in FP8 path", 3, "0123456789")),
        (INFO.replace("behind=3", "behind="), ("main", "Fix: a=b in FP8 path", None, "0123456789")),
        (INFO.replace("branch=main", "branch=HEAD"), ("HEAD", "Fix: a=b in FP8 path", 3, "0123456789")),
    ],
)
def test_parse_git_info(stdout: str, expected: tuple[str, str, int | None, str]) -> None:
    info = git.parse_info(stdout)
    assert (info.branch, info.subject, info.behind, info.short) == expected


@pytest.mark.parametrize("stdout", ["error=not a git checkout: /x\n", "", "garbage\n"])
def test_parse_git_info_errors(stdout: str) -> None:
    with pytest.raises(git.GitInfoError):
        git.parse_info(stdout)


def test_git_info_script_runs_on_a_real_checkout(tmp_path: pytest.TempPathFactory) -> None:
    repo = tmp_path / "odd $(dir)"  # type: ignore[operator]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "first one",
        ],
        check=True,
    )
    out = subprocess.run(git.info_argv(str(repo), "origin/main"), capture_output=True, text=True, check=True)
    info = git.parse_info(out.stdout)
    assert (info.branch, info.subject, info.behind, info.upstream_commit) == ("main", "first one", None, None)


def test_parse_dirty_and_log() -> None:
    assert git.parse_dirty(" M python/sglang/x.py\nM  README.md\n") == ["python/sglang/x.py", "README.md"]
    assert git.parse_log("abc1234 Add thing\ndef5678 Fix: other\n") == [
        ("abc1234", "Add thing"),
        ("def5678", "Fix: other"),
    ]


GPU_CSV = """0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-aaaa, 97887, 1024, 3, 12.0
1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-bbbb, 97887, 0, [N/A], 12.0
"""
APPS_CSV = "4242, python3, GPU-bbbb, 2000\n"


def test_parse_gpus_and_apps() -> None:
    devices = gpus.parse_gpus(GPU_CSV)
    assert [(d.index, d.memory_used_mib, d.utilization_pct, d.compute_cap) for d in devices] == [
        (0, 1024, 3, "12.0"),
        (1, 0, None, "12.0"),
    ]
    assert devices[0].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert gpus.parse_apps(APPS_CSV) == [gpus.GpuProcess(4242, "python3", "GPU-bbbb", 2000)]
    assert gpus.parse_apps("No running processes found\n") == []


SERVER_0_1 = gpus.GpuProcess(10, "sglang::scheduler", "GPU-aaaa", 500)
SERVER_1 = gpus.GpuProcess(10, "sglang::scheduler", "GPU-bbbb", 500)
OTHER_1 = gpus.GpuProcess(20, "python3", "GPU-bbbb", 100)
ELSEWHERE = gpus.GpuProcess(30, "python3", "GPU-cccc", 100)  # a GPU not asked about


@pytest.mark.parametrize(
    ("apps", "pairs", "per_gpu"),
    [
        ([], [], {0: [], 1: []}),
        ([ELSEWHERE], [], {0: [], 1: []}),
        ([OTHER_1, SERVER_0_1, SERVER_1, ELSEWHERE], [(1, OTHER_1), (0, SERVER_0_1), (1, SERVER_1)],
         {0: [SERVER_0_1], 1: [OTHER_1, SERVER_1]}),
    ],
)  # fmt: skip
def test_holders_join_the_two_queries_by_uuid_in_nvidia_smis_order(
    apps: list[gpus.GpuProcess], pairs: list[tuple[int, gpus.GpuProcess]], per_gpu: dict[int, list[gpus.GpuProcess]]
) -> None:
    devices = gpus.parse_gpus(GPU_CSV)
    assert gpus.holders(devices, apps) == pairs
    assert gpus.holders_by_gpu(devices, apps) == per_gpu
    assert gpus.holders(devices[:1], apps) == [p for p in pairs if p[0] == 0]  # only the GPUs asked about


SERVER_HOLDER = gpus.Holder(0, 10, "sglang::scheduler", job="server-1")
TUNE_HOLDER = gpus.Holder(1, 11, "python", job="tune.gpu1-x")
STRANGER = gpus.Holder(1, 20, "python3")


@pytest.mark.parametrize(
    ("ours", "foreign"),
    [
        (None, [SERVER_HOLDER, TUNE_HOLDER, STRANGER]),  # tune-fp8: whoever holds a GPU makes it busy
        ("server-1", [TUNE_HOLDER, STRANGER]),  # serve: all but the old server it replaces
        ("server-2", [SERVER_HOLDER, TUNE_HOLDER, STRANGER]),
    ],
)
def test_the_one_busy_gpu_policy_keeps_every_holder_but_the_job_being_replaced(
    ours: str | None, foreign: list[gpus.Holder]
) -> None:
    assert gpus.foreign_holders([SERVER_HOLDER, TUNE_HOLDER, STRANGER], ours) == foreign
    assert gpus.foreign_holders([SERVER_HOLDER], "server-1") == []


def test_a_busy_gpu_refusal_names_each_holder_and_whose_it_is_when_known() -> None:
    held = [TUNE_HOLDER, STRANGER]
    assert gpus.busy_message("h1", "GPU held by another process", held, owners=True) == (
        "h1: GPU held by another process: GPU 1: pid 11 (python, orch job tune.gpu1-x); "
        "GPU 1: pid 20 (python3, not started by orch)"
    )
    assert gpus.busy_message("h1", "GPUs are busy", held, owners=False) == (
        "h1: GPUs are busy: GPU 1: pid 11 (python); GPU 1: pid 20 (python3)"
    )


def test_parse_gpus_refuses_unexpected_lines() -> None:
    with pytest.raises(gpus.NvidiaSmiError):
        gpus.parse_gpus("0, only two\n")


def test_device_file_name() -> None:
    assert gpus.device_file_name("NVIDIA RTX PRO 6000 Blackwell Server Edition") == (
        "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    )


@pytest.mark.parametrize(
    ("lines", "age"),
    [
        ("fetched=1000\nnow=8200\n", 7200),
        ("fetched=9000\nnow=8200\n", 0),  # a FETCH_HEAD from the future (clock moved back): just now
        ("fetched=\nnow=8200\n", None),  # never fetched (nor cloned with a reflog)
        ("", None),  # an older script without the lines
    ],
)
def test_parse_git_info_reads_the_fetch_age_on_the_hosts_clock(lines: str, age: int | None) -> None:
    assert git.parse_info(INFO + lines).fetched_age_s == age


def _git(repo: object, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_git_info_script_dates_the_last_fetch_from_fetch_head_else_the_clone(tmp_path: pytest.TempPathFactory) -> None:
    upstream, clone = tmp_path / "up", tmp_path / "clone"  # type: ignore[operator]
    subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
    _git(upstream, "commit", "-q", "--allow-empty", "-m", "first")
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    out = subprocess.run(git.info_argv(str(clone), "origin/main"), capture_output=True, text=True, check=True)
    assert git.parse_info(out.stdout).fetched_age_s is not None  # the clone's reflog: no FETCH_HEAD yet
    _git(clone, "fetch", "-q", "origin")
    day_ago = int(subprocess.run(["date", "+%s"], capture_output=True, text=True).stdout) - 86400
    os.utime(clone / ".git" / "FETCH_HEAD", (day_ago, day_ago))
    out = subprocess.run(git.info_argv(str(clone), "origin/main"), capture_output=True, text=True, check=True)
    assert 86400 <= (git.parse_info(out.stdout).fetched_age_s or 0) < 2 * 86400  # FETCH_HEAD's mtime
