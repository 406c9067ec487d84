"""A simulated GPU fleet on this machine, for orch's tests, ``orch demo`` and benchmarks.

Each host is a real OpenSSH ``sshd`` on its own loopback address with a private disk: a simulated
``nvidia-smi``, a real git clone of a simulated SGLang (``sglang_sim/``: the tuner, the server, the
serving benchmark, with SGLang's flags, output lines, file names and HTTP answers) and a
DeepSeek-V4-Flash-like model config. Nothing here connects beyond 127.0.0.0/8.

- ``fleet``: ``SimFleet``, the API (start, inventory, upstream commits, teardown);
- ``host``: ``SimHost``, one host (sshd control, knobs, GPU holders);
- ``hostdisk``: a host's files; ``gitrepo``: the upstream repository; ``modelconfig``: the model;
- ``sshd``, ``sshkeys``, ``loopback``: the SSH daemon, keys, addresses and ports;
- ``processes``: finding every process of a host at teardown; ``inventory``: the ``hosts.yaml``;
- ``hosttools``: programs installed on the hosts (``nvidia-smi``, ``dmesg``/``journalctl``, ``df``).

Knobs (``SimHost.set_knobs``; defaults and meaning in ``sglang_sim/python/sglang/_sim/host.py``):
``gpus``, ``gpu_name``, ``nvidia_smi_fail``; ``orch doctor``'s faults: ``gpu_faults`` (fault name -> GPU index,
``hosttools.nvidia_smi.FAULTS``), ``driver_version``, ``cuda_version``, ``xid_events`` ([code, GPU index] each),
``kernel_log_unreadable``, ``disk_free_mib`` (``hosttools.kernel_log``, ``hosttools.df``), ``nccl_seconds``,
``nccl_p2p_slowdown``, ``nccl_p2p_hang`` (``hosttools.torch_stub``: a simulated torch for ``doctor --nccl``);
tuner: ``tune_seconds_per_unit``, ``tuner_startup_seconds``, ``tuner_fail`` (crash | oom | no_gpu |
hang_at_exit), ``tuner_fail_after``; server: ``startup_seconds``, ``server_fail`` (crash |
never_healthy | ignore_sigterm), ``drain_seconds``, ``drain_log_seconds``, ``accept_length``,
``decode_step_seconds``, ``spec_step_overhead``, ``triton_default_slowdown``, ``tuned_speedup``.
"""

from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.fleet import SimFleet
from orchestrator.sandbox.host import SimHost

__all__ = ["SandboxError", "SimFleet", "SimHost"]
