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
- ``hosttools``: programs installed on the hosts (``nvidia-smi``).
"""

from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.fleet import SimFleet
from orchestrator.sandbox.host import SimHost

__all__ = ["SandboxError", "SimFleet", "SimHost"]
