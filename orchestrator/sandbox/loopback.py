"""Loopback addresses and free ports for simulated hosts.

Each fleet takes its own ``127.A.B.0/24`` (A, B random) so fleets that run at once never share an
address; host ``i`` is ``127.A.B.(i+1)``. Ports come from 20000-32767, below Linux's ephemeral range
(32768-60999), so a port chosen now cannot be taken later by an outgoing connection's local port. When
the tests run in parallel (pytest-xdist's workers ``gw0``..), each worker and the processes it starts take
their own slice of that range, so two workers never pick the same port between choosing and binding it.
"""

from __future__ import annotations

import os
import random
import socket
import time

PORTS = (20000, 32767)
MAX_HOSTS = 250

_handed_out: set[int] = set()


def port_range(environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[int, int]:
    """The ports this process may hand out: all of ``PORTS``, or its test worker's slice of them."""
    worker, count = environ.get("PYTEST_XDIST_WORKER", ""), environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(worker[2:]) < int(count)):
        return PORTS
    size = (PORTS[1] - PORTS[0] + 1) // int(count)
    low = PORTS[0] + int(worker[2:]) * size
    return low, low + size - 1


def fleet_subnet() -> tuple[int, int]:
    """The random middle octets (A, B) of a fleet's ``127.A.B.0/24``."""
    return random.randint(1, 254), random.randint(1, 254)


def host_address(subnet: tuple[int, int], index: int) -> str:
    if not 0 <= index < MAX_HOSTS:
        raise ValueError(f"a simulated fleet has at most {MAX_HOSTS} hosts")
    return f"127.{subnet[0]}.{subnet[1]}.{index + 1}"


def is_free(address: str, port: int) -> bool:
    """Whether ``address:port`` can be bound for listening right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def free_port(*addresses: str) -> int:
    """A port free on every one of ``addresses`` and never handed out before by this process."""
    ports = port_range()
    for _ in range(1000):
        port = random.randint(*ports)
        if port not in _handed_out and all(is_free(a, port) for a in addresses):
            _handed_out.add(port)
            return port
    raise OSError(f"no free port in {ports} on {', '.join(addresses)}")


def wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    """Return once something accepts connections on ``address:port``; OSError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
