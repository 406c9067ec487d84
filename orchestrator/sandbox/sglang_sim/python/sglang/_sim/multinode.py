"""Multi-node launch (``--nnodes N --node-rank I --dist-init-addr HOST:PORT``), simulated over TCP.

As with the real launcher, every node runs the same command but for its rank, and only rank 0 serves
HTTP. Rank 0 listens on ``--dist-init-addr`` (the real one's torch TCPStore) and waits for the N - 1 other
ranks; each connects (retrying until rank 0 is up) and sends its rank and its resolved arguments. Rank 0
refuses a rank whose arguments differ from its own (apart from the rank and where rank 0 listens), a rank
already joined, or a different ``--nnodes``: that rank exits 1 and rank 0 keeps waiting. Once all ranks
joined, every rank goes on starting; rank 0 opens its HTTP port only then.

Each other rank tells rank 0 once it has loaded its part of the model (``loaded_part``); rank 0 is ready only
after all did (``wait_loaded``), as a real group's first forward pass runs through every pipeline stage.
The connections stay open while the server runs: a rank that dies (its socket closed by the kernel)
makes the others exit 1, as a real group's collectives fail when one node goes away. A rank 0 stopping on
SIGTERM tells the others, which exit 0. Knob ``rendezvous_timeout`` (seconds, default 600): how long a rank
waits for the group before giving up (exit 1).
"""

import json
import logging
import socket
import threading
import time

from sglang._sim import host

logger = logging.getLogger("sglang.srt.distributed")

RANK_FIELDS = ("node_rank", "host", "port")  # what differs between the ranks' arguments


class RendezvousError(RuntimeError):
    pass


def is_multinode(server_args):
    return int(server_args.nnodes or 1) > 1


def split_address(addr):
    """``HOST:PORT`` or ``[IPV6]:PORT`` → (host, port)."""
    if not addr:
        raise RendezvousError("--dist-init-addr is required with --nnodes > 1")
    if addr.startswith("["):
        hostname, _, rest = addr[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        hostname, _, port = addr.rpartition(":")
    if not hostname or not port.isdigit():
        raise RendezvousError(f"Invalid --dist-init-addr {addr!r}: expected HOST:PORT")
    return hostname, int(port)


def shared_arguments(server_args):
    """The arguments every rank must share: all but the rank's own, as JSON-ready values."""
    return {k: v for k, v in sorted(vars(server_args).items())
            if not k.startswith("_") and k not in RANK_FIELDS}


def _send(conn, message):
    conn.sendall((json.dumps(message, default=str) + "\n").encode())


def _receive(conn):
    """One JSON line from ``conn``; None when it closed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


class Group:
    """This rank's part of the group: its connections to the others (rank 0: one per rank; others: one)."""

    def __init__(self, server_args, stopping):
        self.rank = int(server_args.node_rank)
        self.nnodes = int(server_args.nnodes)
        self.address = split_address(server_args.dist_init_addr)
        self.arguments = shared_arguments(server_args)
        self.stopping = stopping
        self.peers = {}  # rank → socket
        self.lost = None  # why the group broke, once it did
        self.loaded = set()  # rank 0: the other ranks that loaded their part
        self._loaded = threading.Condition()
        self.deadline = time.monotonic() + float(host.knob("rendezvous_timeout", 600))

    def join(self):
        """Block until every rank joined (RendezvousError: refused, timed out, or stopped meanwhile)."""
        return self._gather() if self.rank == 0 else self._connect()

    def _gather(self):
        family = socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(self.address)
        except OSError as exc:
            raise RendezvousError(f"Cannot listen on --dist-init-addr {self.address[0]}:{self.address[1]}: {exc}")
        listener.listen()
        listener.settimeout(0.2)
        logger.info(f"Rendezvous at {self.address[0]}:{self.address[1]}: waiting for {self.nnodes - 1} node(s).")
        with listener:
            while len(self.peers) < self.nnodes - 1:
                self._check_time()
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                self._admit(conn)
        for conn in self.peers.values():
            _send(conn, {"joined": True})
        logger.info(f"All {self.nnodes} nodes joined the rendezvous.")

    def _admit(self, conn):
        conn.settimeout(10)
        try:
            hello = _receive(conn)
        except (OSError, ValueError):
            hello = None
        if hello is None:
            conn.close()
            return
        rank, why = hello.get("node_rank"), self._refusal(hello)
        if why:
            logger.error(f"Refused node rank {rank} at the rendezvous: {why}")
            _send(conn, {"refused": why})
            conn.close()
            return
        conn.settimeout(None)
        self.peers[rank] = conn
        logger.info(f"Node rank {rank} joined the rendezvous ({len(self.peers) + 1}/{self.nnodes}).")

    def _refusal(self, hello):
        rank = hello.get("node_rank")
        if hello.get("nnodes") != self.nnodes:
            return f"it runs with --nnodes {hello.get('nnodes')}, rank 0 with {self.nnodes}"
        if not isinstance(rank, int) or not 0 < rank < self.nnodes:
            return f"node rank {rank} is not one of 1..{self.nnodes - 1}"
        if rank in self.peers:
            return f"node rank {rank} already joined"
        theirs = hello.get("arguments") or {}
        ours = json.loads(json.dumps(self.arguments, default=str))
        differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        if differ:
            shown = ", ".join(f"{k} ({theirs.get(k)!r}, rank 0: {ours.get(k)!r})" for k in differ[:5])
            return f"its arguments differ from rank 0's: {shown}"
        return None

    def _connect(self):
        logger.info(f"Node rank {self.rank}: joining the rendezvous at {self.address[0]}:{self.address[1]}.")
        while True:
            self._check_time()
            try:
                conn = socket.create_connection(self.address, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        conn.settimeout(None)
        _send(conn, {"node_rank": self.rank, "nnodes": self.nnodes, "arguments": self.arguments})
        answer = _receive(conn)
        if answer is None or "refused" in answer:
            conn.close()
            why = answer["refused"] if answer else "rank 0 closed the connection"
            raise RendezvousError(f"Rank 0 refused node rank {self.rank} at the rendezvous: {why}")
        self.peers[0] = conn
        logger.info(f"Node rank {self.rank} joined the rendezvous of {self.nnodes} nodes.")

    def _check_time(self):
        if self.stopping.is_set():
            raise RendezvousError("Stopped before every node joined the rendezvous.")
        if time.monotonic() > self.deadline:
            raise RendezvousError(f"Timed out waiting for the rendezvous of {self.nnodes} nodes.")

    def watch(self, on_lost):
        """Watch every connection: a rank gone (or rank 0 stopping) calls ``on_lost(why, clean)`` once."""
        for rank, conn in self.peers.items():
            threading.Thread(target=self._watch_one, args=(rank, conn, on_lost), daemon=True).start()

    def _watch_one(self, rank, conn, on_lost):
        message = self._next(conn)
        while message is not None and message.get("loaded"):
            with self._loaded:
                self.loaded.add(rank)
                self._loaded.notify_all()
            message = self._next(conn)
        if self.lost is not None or self.stopping.is_set():
            return
        clean = bool(message and message.get("shutdown"))
        self.lost = f"node rank {rank} {'shut down' if clean else 'left the group (connection lost)'}"
        on_lost(self.lost, clean)

    @staticmethod
    def _next(conn):
        try:
            return _receive(conn)
        except (OSError, ValueError):
            return None

    def loaded_part(self):
        """A rank > 0: tell rank 0 this rank loaded its part of the model."""
        try:
            _send(self.peers[0], {"loaded": True})
        except OSError:
            pass  # rank 0 is gone: the watch says so

    def wait_loaded(self):
        """Rank 0: block until every other rank loaded its part; False when stopped (or the group broke)
        meanwhile."""
        with self._loaded:
            while len(self.loaded) < self.nnodes - 1 and not self.stopping.is_set():
                self._loaded.wait(0.1)
        return not self.stopping.is_set()

    def close(self):
        """Leave the group: rank 0 tells the others it shuts down; every connection is closed."""
        for conn in self.peers.values():
            try:
                if self.rank == 0 and self.lost is None:
                    _send(conn, {"shutdown": True})
                conn.close()
            except OSError:
                pass
