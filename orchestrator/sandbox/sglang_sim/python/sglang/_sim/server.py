"""The simulated server's life: load, look up FP8 configs, get ready, serve, drain on SIGTERM.

Startup: claim the GPUs (CUDA out of memory when other processes hold too much of one), open the HTTP
port (503 until ready), log the model load, run FlashInfer's autotune or reuse its cache (``autotune.py``:
a first launch is ``autotune_seconds`` slower), log one FP8 config line per block-FP8 GEMM shape that
runs on Triton, wait ``startup_seconds``, then ``The server is fired up and ready to roll!``.

FP8 lookups: a shape runs on Triton (and reads the tuned configs) when ``--fp8-gemm-backend triton``
or when N or K is not a multiple of 128; with any other backend on this sm_120 host the shape runs on
CUTLASS and nothing is logged for it. The decode step time is scaled per shape: 1 on CUTLASS,
``tuned_speedup`` on Triton with a tuned config, ``triton_default_slowdown`` on Triton without one.

Multi-node (``--nnodes N``): the nodes meet first (``multinode.py``); rank 0 then starts as above, the
other ranks load their part and run without HTTP; a node that goes away makes the others exit. Each rank
runs its own layers (with ``--pp-size``, its pipeline stage) and, as the real kernels do, looks up the tuned
FP8 config of every block-FP8 shape they run and logs it on the stage's TP rank 0 (reference §1.2:
``log_info_on_rank0`` is per TP group, so each stage's log has the lines). Every stage's layers have the
same shapes at the same TP size, so each rank looks up the same ones (the NextN layer's too: which stage
loads it is not simulated). Rank 0 is ready only once every other rank loaded its part (a real group's
first forward pass runs through every stage), so each rank's config lines are logged before ``/health``
answers 200. With ``--pp-size`` the log prefix names the stage (``[... PP1 TP0]``), as the real scheduler's.

Faults (knob ``server_fail``): ``crash`` (``Initialization failed. warmup error: ...`` + traceback,
exit 1; on a multi-node rank > 0 too, after the rendezvous), ``never_healthy`` (never ready), ``ignore_sigterm`` (SIGTERM does nothing).
"""

import logging
import os
import signal
import sys
import threading
import time
import traceback

from sglang._sim import autotune, gpus, host, multinode
from sglang._sim.engine import Engine
from sglang._sim.faults import cuda_oom
from sglang._sim.http_api import HttpServer
from sglang._sim.model import architecture, fp8_gemm_shapes, load_config
from sglang._sim.profiler import Profiler
from sglang.kernels.ops.gemm import fp8_kernel

logger = logging.getLogger("sglang.srt.entrypoints.http_server")

SERVER_PROCESS_NAME = "sglang::scheduler"


def configure_logging(level="info", prefix=" TP0"):
    """SGLang's log format: ``[%Y-%m-%d %H:%M:%S TP0] message`` on stderr (as ``logging.basicConfig``);
    uvicorn's for HTTP access lines, on stdout (uvicorn's default). ``prefix``: the scheduler's
    (``log_prefix``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    access = logging.StreamHandler(sys.stdout)
    access.setFormatter(logging.Formatter("[%(asctime)s] INFO:     %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    access_log = logging.getLogger("uvicorn.access")
    access_log.handlers[:], access_log.propagate = [access], False


def log_prefix(server_args):
    """The scheduler's log prefix for its TP rank 0: `` PP1 TP0`` on the second pipeline stage (the real
    one adds `` PP{pp_rank}`` when ``pp_size > 1``), `` TP0`` otherwise; the stages split over the nodes."""
    pp_size, nodes = int(server_args.pp_size or 1), int(server_args.nnodes or 1)
    if pp_size <= 1:
        return " TP0"
    return f" PP{int(server_args.node_rank or 0) * pp_size // nodes} TP0"


class App:
    """What the HTTP handlers see: the state, the resolved arguments, the model, the scheduler."""

    def __init__(self, server_args):
        self.server_args = server_args
        self.config = load_config(server_args.model_path)
        self.context_length = server_args.context_length or self.config.get("max_position_embeddings", 4096)
        self.state = "starting"
        self.started = time.time()
        self.startup_time = None  # the real scheduler's startup phases in seconds (None until ready)
        self.engine = None
        self.stopping = threading.Event()
        self.group = None  # this node's part of a multi-node launch (``multinode.Group``), else None
        self.exit_code = 0


def gpus_for(tp_size):
    visible = host.visible_gpus()
    if len(visible) < tp_size:
        raise RuntimeError(f"Not enough GPUs: tp_size={tp_size} but only {len(visible)} visible.")
    return visible[:tp_size]


def claim_gpus(server_args):
    """Register this node's GPUs (TP x PP over the nodes) with the static memory; CUDA OOM when another
    process holds too much."""
    need = int(host.GPU_TOTAL_MIB * server_args.mem_fraction_static)
    nodes = int(server_args.nnodes or 1)
    indexes = gpus_for(server_args.tp_size * int(server_args.pp_size or 1) // nodes)
    free = min(host.GPU_TOTAL_MIB - gpus.used_mib(i) for i in indexes)
    logger.info(f"Load weight begin. avail mem={free / 1024:.2f} GB")
    if free < need:
        raise cuda_oom(0, (need - 1000) / 1024, free)
    gpus.register(indexes, need, SERVER_PROCESS_NAME)
    return free


def fp8_step_factor(server_args, config):
    """Look up the tuned config of every block-FP8 shape (logging as SGLang does); the step time factor.
    An explicit ``cutlass`` backend raises at the first GEMM on any GPU but sm_120 (``fp8_utils.py``)."""
    if server_args.fp8_gemm_runner_backend == "cutlass" and not host.compute_cap().startswith("12."):
        raise RuntimeError("--fp8-gemm-backend=cutlass is deprecated on this hardware. "
                           "Please switch to DeepGEMM or FlashInfer TRTLLM on SM90/SM100.")
    factors = []
    mtp = server_args.speculative_algorithm is not None
    for _name, n, k in fp8_gemm_shapes(config, server_args.tp_size, mtp):
        if not fp8_kernel.uses_triton_kernel(server_args.fp8_gemm_runner_backend, n, k):
            factors.append(1.0)
        elif fp8_kernel.get_w8a8_block_fp8_configs(n, k, 128, 128) is not None:
            factors.append(float(host.knob("tuned_speedup", 0.85)))
        else:
            factors.append(float(host.knob("triton_default_slowdown", 1.25)))
    return sum(factors) / len(factors) if factors else 1.0


def make_engine(server_args, config):
    fp8_factor = fp8_step_factor(server_args, config)
    step = float(host.knob("decode_step_seconds", 0.005)) * fp8_factor
    if server_args.speculative_algorithm is not None:
        step *= float(host.knob("spec_step_overhead", 1.2))
    engine = Engine(server_args, step, accept_length(server_args))
    engine.profiler = Profiler(server_args, config, fp8_factor)
    return engine


def accept_length(server_args):
    """Knob ``accept_length`` (tokens per verify step): by default what upstream's tests see, 3.1 for
    EAGLE 3/1/4 (> 2.8) and 4.6 for DSPARK's 8-token blocks (> 4.0); never more than the tokens verified."""
    default = 4.6 if server_args.speculative_algorithm == "DSPARK" else 3.1
    verified = server_args.speculative_num_draft_tokens or default
    return min(float(host.knob("accept_length", default)), float(verified))


def install_sigterm(app):
    if host.knob("server_fail", None) == "ignore_sigterm":
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        return

    def on_sigterm(signum, frame):
        logger.info(f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down...")
        app.state = "exiting"
        app.stopping.set()

    signal.signal(signal.SIGTERM, on_sigterm)


def warmup_failure():
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    except RuntimeError:
        return traceback.format_exc()


def drain(app):
    """Wait for in-flight requests (and at least ``drain_seconds``), logging what remains."""
    deadline = time.monotonic() + float(host.knob("drain_seconds", 0))
    every = float(host.knob("drain_log_seconds", 5))
    next_log = time.monotonic()
    while app.engine.in_flight() or time.monotonic() < deadline:
        if time.monotonic() >= next_log:
            rids = app.engine.in_flight()
            logger.info(f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                        f"Remaining requests remaining_rids={rids}.")
            next_log += every
        time.sleep(0.02)


def log_load(app, free):
    args, config = app.server_args, app.config
    static = host.GPU_TOTAL_MIB * args.mem_fraction_static / 1024
    logger.info(f"Load weight end. type={architecture(config)}, dtype=torch.bfloat16, "
                f"avail mem={free / 1024 - 38.5:.2f} GB, mem usage=38.50 GB.")
    logger.info(f"KV Cache is allocated. #tokens: 1048576, KV size: {static - 38.5:.2f} GB")
    autotune.run(args, config, app.stopping)  # the warmup's FlashInfer autotune, before the CUDA graphs
    logger.info(f"Capture cuda graph begin. This can take up to several minutes. "
                f"avail mem={free / 1024 - static:.2f} GB")


def run(server_args):
    """Resolve the arguments, start, serve until SIGTERM, drain; return the exit status."""
    server_args.resolve_once()
    app = App(server_args)
    install_sigterm(app)
    logger.info(f"server_args={server_args!r}")
    host.write_log_noise(sys.stderr)
    if multinode.is_multinode(server_args) and not join_group(app):
        return 1
    free = claim_gpus(server_args)
    if app.group is not None and app.group.rank > 0:
        return follow(app, free)
    httpd = HttpServer(app, server_args.host, server_args.port)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log_load(app, free)
    app.engine = make_engine(server_args, app.config)
    app.engine.start()
    started = time.monotonic()
    if app.stopping.wait(float(host.knob("startup_seconds", 0.5))):
        return shutdown(app)
    hold = host.knob("startup_hold_file", None)
    while hold and os.path.exists(hold):  # a test holds its new servers loading until it lets them go
        if app.stopping.wait(0.1):
            return shutdown(app)
    if app.group is not None and not app.group.wait_loaded():
        return shutdown(app)
    logger.info(f"Capture cuda graph end. Time elapsed: {time.monotonic() - started:.2f} s.")
    logger.info(f"Uvicorn running on http://{server_args.host}:{server_args.port} (Press CTRL+C to quit)")
    return serve(app)


def join_group(app):
    """Join the other nodes (``multinode``); False (logged) when the rendezvous fails."""
    group = multinode.Group(app.server_args, app.stopping)
    try:
        group.join()
    except multinode.RendezvousError as exc:
        logger.error(str(exc))
        return False
    app.group = group
    group.watch(lambda why, clean: group_lost(app, why, clean))
    return True


def group_lost(app, why, clean):
    """Another node went away: this one stops too (exit 1, or 0 when rank 0 shut down cleanly)."""
    (logger.info if clean else logger.error)(f"The multi-node group ended: {why}. Exiting.")
    app.exit_code = 0 if clean else 1
    app.state = "exiting"
    app.stopping.set()


def follow(app, free):
    """A node of rank > 0: load its part of the model (its layers look up their tuned FP8 configs), tell
    rank 0, and run with rank 0 (no HTTP) until stopped."""
    log_load(app, free)
    if host.knob("server_fail", None) == "crash":  # a rank > 0 failing its warmup: the others see it leave
        logger.error(f"Initialization failed. warmup error: {warmup_failure()}")
        gpus.release()
        app.group.close()
        return 1
    fp8_step_factor(app.server_args, app.config)
    app.group.loaded_part()
    logger.info(f"Node rank {app.group.rank} is ready; rank 0 serves HTTP.")
    app.stopping.wait()
    gpus.release()
    app.group.close()
    return app.exit_code


def serve(app):
    fault = host.knob("server_fail", None)
    if fault == "crash":
        logger.error(f"Initialization failed. warmup error: {warmup_failure()}")
        gpus.release()
        return 1
    if fault != "never_healthy":
        app.state = "serving"
        took = round(time.time() - app.started, 3)
        app.startup_time = {"load_weight": 0.0, "kv_cache_allocation": 0.0, "cuda_graph": {"decode": took},
                            "scheduler_e2e": took, "tokenizer_e2e": took}
        logger.info("The server is fired up and ready to roll!")
    app.stopping.wait()
    return shutdown(app)


def shutdown(app):
    app.state = "exiting"
    drain(app)
    gpus.release()
    if app.group is not None:
        app.group.close()
    return app.exit_code
