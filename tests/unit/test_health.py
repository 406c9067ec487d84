"""``facts.health``: doctor's parsers over the text hosts print (``nvidia-smi -q`` in the real layout,
the kernel log, ``df -P``, the model directory, the Python's ``sglang``), one table per check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.facts import health
from orchestrator.facts.health import Finding
from orchestrator.facts.probe import Section

HEADER = """
==============NVSMI LOG==============

Timestamp                                 : Thu Dec  3 09:00:00 2026
Driver Version                            : 580.95.05
CUDA Version                              : 13.0

Attached GPUs                             : 1
"""

HEALTHY = """GPU 00000000:18:00.0
    Product Name                          : NVIDIA RTX PRO 6000 Blackwell Server Edition
    Persistence Mode                      : Enabled
    PCI
        Bus Id                            : 00000000:18:00.0
        GPU Link Info
            PCIe Generation
                Max                       : 5
                Current                   : {gen}
                Device Current            : {gen}
                Device Max                : 5
                Host Max                  : 5
            Link Width
                Max                       : 16x
                Current                   : {width}
    Performance State                     : P0
    Clocks Event Reasons
        Idle                              : {idle}
        SW Power Cap                      : Not Active
        HW Slowdown                       : {hw}
            HW Thermal Slowdown           : {hw}
            HW Power Brake Slowdown       : Not Active
        SW Thermal Slowdown               : {sw}
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 5
            DRAM Uncorrectable            : {dram}
        Aggregate
            DRAM Uncorrectable            : 9
    Retired Pages
        Single Bit ECC                    : 0
        Double Bit ECC                    : {retired}
        Pending Page Blacklist            : {blacklist}
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : {remapped}
        Pending                           : {pending}
        Remapping Failure Occurred        : {failure}
        Bank Remap Availability Histogram
            Max                           : 1536 bank(s)
    Processes                             : None
"""

# A driver before 535 (an A100): "Clocks Throttle Reasons", ECC counted as Single/Double Bit.
OLD_DRIVER = """
Driver Version                            : 470.82.01
CUDA Version                              : 11.4

Attached GPUs                             : 1
GPU 00000000:07:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    Persistence Mode                      : Enabled
    Clocks Throttle Reasons
        Idle                              : Not Active
        HW Slowdown                       : Active
            HW Thermal Slowdown           : Not Active
            HW Power Brake Slowdown       : Active
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 0
                Total                     : 0
            Double Bit
                Device Memory             : 1
                Total                     : 1
    Remapped Rows                         : N/A
"""


def gpu_text(**changes: object) -> str:
    values: dict[str, object] = dict(
        gen=5, width="16x", idle="Not Active", hw="Not Active", sw="Not Active", dram=0, retired=0,
        blacklist="No", remapped=0, pending="No", failure="No",
    )  # fmt: skip
    return HEALTHY.format(**{**values, **changes})


def gpu(**changes: object) -> health.GpuReport:
    return health.parse_query(HEADER + gpu_text(**changes)).gpus[0]


def test_query_reads_the_header_and_each_gpu_by_its_indented_path() -> None:
    report = health.parse_query(HEADER + gpu_text() + gpu_text().replace("18:00.0", "28:00.0"))
    assert (report.driver, report.cuda, report.attached) == ("580.95.05", "13.0", 1)
    assert [g.bus_id for g in report.gpus] == ["00000000:18:00.0", "00000000:28:00.0"]
    first = report.gpus[0]
    assert first.get("PCI/GPU Link Info/Link Width/Max") == "16x"
    assert first.get("Clocks Event Reasons/HW Thermal Slowdown") == "Not Active"
    assert first.get("ECC Errors/Volatile/DRAM Correctable") == "5"


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, []),
        ({"idle": "Active", "gen": 1}, []),  # an idle GPU lowers its link speed: normal
        ({"gen": 3}, [Finding("warn", "PCIe gen 3 under load, the link's maximum is gen 5")]),
        ({"width": "4x"}, [Finding("fail", "PCIe link x4, the GPU's maximum is x16")]),
        ({"dram": 2}, [Finding("fail", "uncorrectable ECC errors since boot: DRAM Uncorrectable 2")]),
        ({"hw": "Active"}, [Finding("fail", "clocks slowed: HW Slowdown, HW Thermal Slowdown")]),
        ({"sw": "Active"}, [Finding("warn", "clocks slowed: SW Thermal Slowdown")]),
        ({"retired": 3}, [Finding("warn", "3 memory pages retired for double-bit ECC errors")]),
        (
            {"blacklist": "Yes"},
            [Finding("warn", "a page retirement is pending (takes effect at the next GPU reset)")],
        ),
        (
            {"failure": "Yes", "pending": "Yes"},
            [Finding("fail", "row remapping failed (memory it cannot repair: a candidate for replacement)")],
        ),
        ({"pending": "Yes"}, [Finding("warn", "a row remapping is pending (takes effect at the next GPU reset)")]),
        ({"remapped": 4}, [Finding("warn", "4 rows remapped for uncorrectable errors")]),
    ],
)
def test_each_gpu_condition_is_one_finding(changes: dict[str, object], expected: list[Finding]) -> None:
    assert health.check_gpu(gpu(**changes)) == expected


def test_persistence_mode_off_warns() -> None:
    off = health.parse_query(HEADER + gpu_text().replace(": Enabled", ": Disabled")).gpus[0]
    assert health.check_gpu(off) == [
        Finding("warn", "persistence mode off (each start re-initialises the GPU; `nvidia-smi -pm 1`)")
    ]


def test_an_older_driver_says_throttle_reasons_and_double_bit() -> None:
    report = health.parse_query(OLD_DRIVER)
    assert (report.driver, report.cuda) == ("470.82.01", "11.4")
    assert health.check_gpus(report, 1) == [
        Finding("fail", "GPU 0: uncorrectable ECC errors since boot: Double Bit/Total 1"),
        Finding("fail", "GPU 0: clocks slowed: HW Power Brake Slowdown, HW Slowdown"),
    ]


@pytest.mark.parametrize(
    "count, expected, finding",
    [
        (8, 8, None),
        (7, 8, Finding("fail", "7 GPUs, the inventory says 8")),
        (8, 4, Finding("warn", "8 GPUs, the inventory says 4 (the rest stay idle)")),
    ],
)
def test_gpu_count_against_the_inventory(count: int, expected: int, finding: Finding | None) -> None:
    blocks = "".join(gpu_text().replace("18:00.0", f"{0x18 + i:02x}:00.0") for i in range(count))
    assert health.check_gpus(health.parse_query(HEADER + blocks), expected) == ([finding] if finding else [])


def test_mixed_gpu_models_warn() -> None:
    text = HEADER + gpu_text() + gpu_text().replace("RTX PRO 6000 Blackwell Server Edition", "H100 80GB HBM3")
    assert health.check_gpus(health.parse_query(text), 2) == [
        Finding("warn", "mixed GPU models: NVIDIA H100 80GB HBM3, NVIDIA RTX PRO 6000 Blackwell Server Edition")
    ]


XID_LOG = """[  812.1] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus.
[  813.2] NVRM: Xid (PCI:0000:28:00): 13, pid=2, name=python3, Graphics Exception
[  814.3] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus."""


@pytest.mark.parametrize(
    "section, expected",
    [
        (Section(0, ""), []),
        (
            Section(0, XID_LOG),
            [
                Finding("warn", "PCI:0000:28:00: Xid 13 since boot, 1x"),
                Finding("fail", "GPU 0: Xid 79 (GPU fell off the bus) since boot, 2x"),
            ],
        ),
        (
            Section(3, "neither dmesg nor journalctl -k can be read by this user"),
            [Finding("note", "Xid events not checked: neither dmesg nor journalctl -k can be read by this user")],
        ),
        (None, [Finding("note", "Xid events not checked: no answer")]),
    ],
)
def test_xid_events_in_the_kernel_log(section: Section | None, expected: list[Finding]) -> None:
    buses = {health.bus_key("00000000:18:00.0"): 0}
    assert health.check_kernel_log(section, buses) == expected


def df_line(path: str, free_kib: int, mount: str) -> str:
    return f"{path}\t/dev/nvme0n1p1 1000000000 1 {free_kib} 1% {mount}"


@pytest.mark.parametrize(
    "lines, model_bytes, expected",
    [
        ([df_line("/root/.orch", 100 << 20, "/"), df_line("/models/M", 100 << 20, "/")], 0, []),
        (
            [df_line("/root/.orch", 10 << 20, "/"), df_line("/models/M", 100 << 20, "/models")],
            0,
            [Finding("warn", "10.0 GiB free on / (/root/.orch), below the 20.0 GiB margin")],
        ),
        (
            [df_line("/models/M", 50 << 20, "/models")],
            700 << 30,  # a 700 GiB model: the margin is a tenth of it
            [Finding("warn", "50.0 GiB free on /models (/models/M), below the 70.0 GiB margin")],
        ),
        (
            [df_line("/root/.orch", 512 << 10, "/"), df_line("/root/sglang", 512 << 10, "/")],
            0,
            [Finding("fail", "0.5 GiB free on / (/root/.orch, /root/sglang)")],
        ),
        (["df: /x: No such file or directory"], 0, [Finding("warn", "free disk space not checked: df gave no answer")]),
    ],
)
def test_free_disk_space_per_filesystem(lines: list[str], model_bytes: int, expected: list[Finding]) -> None:
    assert health.check_disk(Section(0, "\n".join(lines)), model_bytes) == expected


INDEX = json.dumps({"metadata": {"total_size": 2}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})


@pytest.mark.parametrize(
    "listing, index, expected",
    [
        ("10\tf\tconfig.json\n5\tf\tm-1.safetensors\n5\tf\tm-2.safetensors\n", INDEX, []),
        (
            "10\tf\tconfig.json\n5\tf\tm-1.safetensors\n0\tf\tm-2.safetensors\n",
            INDEX,
            [Finding("fail", "model /m: missing or empty: m-2.safetensors")],
        ),
        (  # a broken link (a Hugging Face snapshot whose blob is gone) is a missing shard
            "10\tf\tconfig.json\n5\tf\tm-1.safetensors\n40\tl\tm-2.safetensors\n",
            INDEX,
            [Finding("fail", "model /m: missing or empty: m-2.safetensors")],
        ),
        (
            "5\tf\tm-1.safetensors\n5\tf\tm-2.safetensors\n",
            INDEX,
            [Finding("fail", "model /m: missing or empty: config.json")],
        ),
        (
            "10\tf\tconfig.json\n",
            None,
            [Finding("warn", "model /m: no model.safetensors.index.json and no .safetensors file")],
        ),
        ("10\tf\tconfig.json\n5\tf\tmodel.safetensors\n", None, []),
    ],
)
def test_model_files_against_its_index(listing: str, index: str | None, expected: list[Finding]) -> None:
    indexed = Section(0, index) if index is not None else Section(1, "cat: m: No such file or directory")
    assert health.check_model(health.parse_model(Section(0, listing), indexed), "/m") == expected


def test_a_model_directory_that_cannot_be_listed_fails() -> None:
    listing = Section(1, "find: '/m': No such file or directory")
    model = health.parse_model(listing, None)
    assert health.check_model(model, "/m") == [Finding("fail", "model directory /m cannot be listed")]


def py(origin: str | None, checkout: str) -> str:
    """What the python section prints: one JSON line."""
    return json.dumps([origin, checkout])


@pytest.mark.parametrize(
    "section, expected",
    [
        (Section(0, py("/root/sglang/python/sglang/__init__.py", "/root/sglang")), []),
        (Section(0, py("/r/sg \\ \n/python/sglang/__init__.py", "/r/sg \\ \n")), []),  # any character in a path
        (
            Section(0, py("/usr/lib/python3/site-packages/sglang/__init__.py", "/root/sglang")),
            [
                Finding(
                    "fail",
                    "python /py imports sglang from /usr/lib/python3/site-packages/sglang/__init__.py, "
                    "not from sglang_dir /root/sglang",
                )
            ],
        ),
        (
            Section(0, py(None, "/root/sglang")),
            [Finding("fail", "python /py cannot import sglang (`orch pull --install`)")],
        ),
        (
            Section(127, "timeout: failed to run command '/py': No such file or directory"),
            [
                Finding(
                    "fail", "python /py does not start: timeout: failed to run command '/py': No such file or directory"
                )
            ],
        ),
        # a checkout whose name is a prefix of another's is not it
        (
            Section(0, py("/root/sglang-old/python/sglang/__init__.py", "/root/sglang")),
            [
                Finding(
                    "fail",
                    "python /py imports sglang from /root/sglang-old/python/sglang/__init__.py, "
                    "not from sglang_dir /root/sglang",
                )
            ],
        ),
    ],
)
def test_which_sglang_the_serving_python_imports(section: Section, expected: list[Finding]) -> None:
    assert health.check_python(section, "/py", "/root/sglang") == expected


@pytest.mark.parametrize(
    "drivers, expected",
    [
        ({"a": "580", "b": "580", "c": "580"}, {"a": [], "b": [], "c": []}),
        (
            {"a": "580", "b": "570", "c": "580"},
            {"a": [], "b": [Finding("warn", "driver 570, the fleet's is 580 (2 of 3)")], "c": []},
        ),
        (
            {"a": "580", "b": "570"},
            {
                "a": [Finding("warn", "driver 580: the fleet is split (570 on 1, 580 on 1)")],
                "b": [Finding("warn", "driver 570: the fleet is split (570 on 1, 580 on 1)")],
            },
        ),
        ({"a": "580"}, {"a": []}),
    ],
)
def test_an_outlier_driver_in_the_fleet_warns(drivers: dict[str, str], expected: dict[str, list[Finding]]) -> None:
    assert health.fleet_findings({host: {"driver": v} for host, v in drivers.items()}) == expected


@pytest.mark.parametrize(
    "severities, verdict",
    [((), "ok"), (("note",), "ok"), (("note", "warn"), "warn"), (("warn", "fail", "note"), "fail")],
)
def test_the_worst_finding_is_the_verdict(severities: tuple[str, ...], verdict: str) -> None:
    assert health.verdict([Finding(s, "x") for s in severities]) == verdict  # type: ignore[arg-type]


def test_nvidia_smi_that_hangs_or_fails_fails_the_host() -> None:
    found = {"nvidia": Section(124, "")}
    assert health.assess("h", found, 8, "/py", "/s", "/m").findings[0] == Finding(
        "fail", "nvidia-smi -q: did not answer in time (a wedged driver?)"
    )
    found = {"nvidia": Section(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")}
    assert health.assess("h", found, 8, "/py", "/s", "/m").findings[0] == Finding(
        "fail", "nvidia-smi -q: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def ran(seconds: float, world: int = 8, size: int = 64 << 20) -> Section:
    return Section(0, json.dumps({"seconds": seconds, "bytes": size, "world": world}))


HUNG = Section(124, "")


@pytest.mark.parametrize(
    "p2p, no_p2p, env, expected",
    [
        (
            ran(0.004),
            ran(0.0035),
            {},
            [Finding("note", "NCCL all-reduce 29.4 GB/s bus bandwidth (33.6 without P2P)")],
        ),
        (
            ran(0.012),
            ran(0.004),
            {},
            [
                Finding(
                    "warn",
                    "NCCL all-reduce 3.0x slower with peer-to-peer on "
                    "(set NCCL_P2P_DISABLE=1 in the host's env in hosts.yaml)",
                )
            ],
        ),
        (
            HUNG,
            ran(0.004),
            {},
            [
                Finding(
                    "fail",
                    "NCCL all-reduce hangs with peer-to-peer on (90 s; set NCCL_P2P_DISABLE=1 in the host's env in "
                    "hosts.yaml)",
                )
            ],
        ),
        (  # already set where orch serves: said, not failed
            HUNG,
            ran(0.004),
            {"NCCL_P2P_DISABLE": "1"},
            [
                Finding(
                    "note",
                    "NCCL all-reduce hangs with peer-to-peer on (90 s; the host's env in hosts.yaml sets "
                    "NCCL_P2P_DISABLE=1)",
                )
            ],
        ),
        (HUNG, HUNG, {}, [Finding("fail", "NCCL all-reduce hangs, with and without NCCL_P2P_DISABLE=1 (90 s)")]),
        (ran(0.004), HUNG, {}, [Finding("fail", "NCCL all-reduce hangs with NCCL_P2P_DISABLE=1 (90 s)")]),
        (
            Section(0, json.dumps({"error": "cannot import torch (No module named 'torch')"})),
            Section(0, json.dumps({"error": "cannot import torch (No module named 'torch')"})),
            {},
            [Finding("warn", "NCCL not checked: cannot import torch (No module named 'torch')")],
        ),
        (
            Section(1, "Traceback (most recent call last):\nRuntimeError: NCCL error: unhandled system error"),
            ran(0.004),
            {},
            [Finding("warn", "NCCL not checked: RuntimeError: NCCL error: unhandled system error")],
        ),
    ],
)
def test_nccl_all_reduce_with_and_without_peer_to_peer(
    p2p: Section, no_p2p: Section, env: dict[str, str], expected: list[Finding]
) -> None:
    assert health.check_nccl(health.parse_all_reduce(p2p), health.parse_all_reduce(no_p2p), env) == expected


def test_a_replica_groups_host_lacking_its_network_interface_fails() -> None:
    """A typo in a group's ``network_interface`` was found by ``serve`` alone, never by ``orch doctor``."""
    env = {"NCCL_SOCKET_IFNAME": "eth9", "GLOO_SOCKET_IFNAME": "eth9"}
    listing = Section(0, "eth0\nlo\n")
    assert health.check_interfaces(listing, "b2", env) == [
        Finding(
            "fail",
            "no network interface eth9 for NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME (the host has eth0, lo): its "
            "replica group's rank would fail to start; set the `network_interface` of b2's group in hosts.yaml "
            "to one of its interfaces",
        )
    ]
    assert health.check_interfaces(listing, "b2", {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"}) == []
    unlisted = health.check_interfaces(Section(2, "ls: cannot access"), "b2", env)
    assert [f.severity for f in unlisted] == ["fail"] and "could not list" in unlisted[0].text
    assert health.assess("b2", {"net": listing}, 8, "python", "/s", "/m", interface_env=env).verdict == "fail"
    assert not any("network interface" in f.text for f in health.assess("b1", {}, 8, "python", "/s", "/m").findings)


def test_an_all_reduce_run_by_the_simulated_torch_is_labelled_simulated_in_text_and_json(tmp_path: Path) -> None:
    """`sim-1: ok (NCCL all-reduce 5.5 GB/s bus bandwidth (5.8 without P2P))` never said the host was simulated.
    The very script doctor runs, with the sandbox's torch: its answer says so; a real torch's says nothing."""
    from orchestrator.sandbox.hosttools import torch_stub
    from orchestrator.views.doctor import doctor_document, doctor_line

    shutil.copytree(Path(torch_stub.__file__).parent, tmp_path / "torch")
    script = health.nccl_sections(sys.executable, 2)[0][1][-5:]  # -c SCRIPT gpus mib rounds
    environment = {k: v for k, v in os.environ.items() if k != "ORCH_SIM_HOST"} | {"PYTHONPATH": str(tmp_path)}
    answer = subprocess.run([sys.executable, *script], capture_output=True, text=True, env=environment, timeout=60)
    assert json.loads(answer.stdout.splitlines()[-1])["simulated"] is True, answer.stderr
    simulated = Section(0, answer.stdout)
    checked = health.assess("sim-1", {"nccl_p2p": simulated, "nccl_no_p2p": simulated}, 2, "/py", "/s", "/m")
    (note,) = [f for f in checked.findings if f.text.startswith("NCCL")]
    assert note.text.startswith("NCCL all-reduce ") and note.text.endswith(" without P2P) [simulated]")
    assert doctor_line(checked).endswith(" without P2P) [simulated])")
    assert doctor_document([checked])["hosts"][0]["simulated"] is True
    real = health.assess("b1", {"nccl_p2p": ran(0.004), "nccl_no_p2p": ran(0.0035)}, 8, "/py", "/s", "/m")
    assert Finding("note", "NCCL all-reduce 29.4 GB/s bus bandwidth (33.6 without P2P)") in real.findings
    assert doctor_document([real])["hosts"][0]["simulated"] is False
    unmeasured = health.assess("b1", {}, 8, "/py", "/s", "/m")  # no --nccl: nothing measured, nothing said
    assert doctor_document([unmeasured])["hosts"][0]["simulated"] is None
    slow = Section(0, json.dumps({"seconds": 0.012, "bytes": 64 << 20, "world": 8, "simulated": True}))
    fast = Section(0, json.dumps({"seconds": 0.004, "bytes": 64 << 20, "world": 8, "simulated": True}))
    (warning,) = health.check_nccl(health.parse_all_reduce(slow), health.parse_all_reduce(fast), {})
    assert warning.text.endswith(
        "with peer-to-peer on (set NCCL_P2P_DISABLE=1 in the host's env in hosts.yaml) [simulated]"
    )
