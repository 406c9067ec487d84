"""The server's HTTP endpoints (what SGLang's FastAPI app answers), on a threading HTTP server.

``/health`` and ``/health_generate`` answer 503 while the server starts or exits, 200 when serving.
``/server_info`` (and the deprecated ``/get_server_info``) returns every resolved server argument at the
top level plus ``internal_states``. ``POST /generate`` waits for the scheduler (streams with
``"stream": true`` as ``data: {...}`` server-sent events). ``/v1/loads`` is SGLang 0.5's per-DP-rank load
(``{"timestamp", "version", "accelerator", "num_accelerators", "loads": [{"dp_rank", "num_running_reqs",
"num_waiting_reqs", "num_used_tokens", ...}]}``, sglang/srt/entrypoints/v1_loads.py); there is no
``/get_load`` (404, as on the real server; see orch's ``docs/gateway.md`` for what the gateway asks).
``POST /start_profile`` / ``/stop_profile``: the torch profiler (``profiler.py``), plain-text answers.
"""

import json
import sys
import logging
import time
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.version import __version__
from sglang._sim.engine import Request
from sglang.srt.server_args import load_snapshot

access_log = logging.getLogger("uvicorn.access")


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""

    @property
    def app(self):
        return self.server.app

    def do_GET(self):
        routes = {"/health": self.health, "/health_generate": self.health, "/ready": self.health,
                  "/v1/models": self.models, "/model_info": self.model_info, "/get_model_info": self.model_info,
                  "/server_info": self.server_info, "/get_server_info": self.server_info,
                  "/v1/loads": self.loads, "/start_profile": self.start_profile, "/stop_profile": self.stop_profile}
        route = routes.get(self.path.split("?")[0])
        return route() if route else self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        routes = {"/generate": self.generate, "/start_profile": self.start_profile, "/stop_profile": self.stop_profile}
        route = routes.get(self.path.split("?")[0])
        return route() if route else self.send_json(404, {"detail": "Not Found"})

    def health(self):
        if self.app.state == "serving":
            return self.send_json(200, {"status": "ok"} if self.path == "/ready" else None)
        return self.send_json(503, None)

    def models(self):
        args = self.app.server_args
        model = {"id": args.served_model_name, "object": "model", "created": int(self.app.started),
                 "owned_by": "sglang", "root": args.model_path, "max_model_len": self.app.context_length}
        self.send_json(200, {"object": "list", "data": [model]})

    def model_info(self):
        args = self.app.server_args
        self.send_json(200, {"model_path": args.model_path, "tokenizer_path": args.tokenizer_path,
                             "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                             "architectures": self.app.config.get("architectures"),
                             "model_type": self.app.config.get("model_type")})

    def loads(self):
        engine = self.app.engine
        if engine is None:
            return self.send_json(503, None)
        with engine.changed:
            running, waiting = list(engine.running), list(engine.waiting)
        used = int(sum(r.prompt_tokens + r.completion_tokens for r in running))
        load = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": len(running),
                "num_waiting_reqs": len(waiting),
                "num_waiting_uncached_tokens": int(sum(r.prompt_tokens for r in waiting)),
                "num_used_tokens": used, "num_total_tokens": used, "num_active_tokens": used,
                "num_prealloc_ready_tokens": 0, "max_total_num_tokens": 0, "max_running_requests": engine.max_running,
                "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
                "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None}
        self.send_json(200, {"timestamp": datetime.now(timezone.utc).isoformat(), "version": __version__,
                             "accelerator": None, "num_accelerators": 1, "loads": [load]})

    def server_info(self):
        info = server_info(self.app.server_args)
        # the real route's own keys beside build_server_info's (srt/entrypoints/http_server.py `server_info`)
        info.update(startup_time=self.app.startup_time, internal_states=[self.app.engine.internal_state()],
                    version=__version__, frontend="python")
        # a key the real server never writes: orch labels what this server measures simulated (as the
        # benchmark's and the profiler's "simulated")
        info["simulated"] = {"by": "orch's simulated SGLang", "model": "sglang/_sim/engine.py"}
        self.send_json(200, info)

    def generate(self):
        if self.app.state != "serving":
            return self.send_json(503, {"error": {"message": "The server is not ready or is shutting down."}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        request = Request(_prompt_tokens(body), body.get("sampling_params", {}).get("max_new_tokens", 128))
        self.app.engine.submit(request)
        if body.get("stream"):
            return self.stream(request)
        self.wait_for(request, lambda: request.finished)
        self.send_json(200, self.output(request))

    def start_profile(self):
        """``POST /start_profile`` (``ProfileReqInput``): 200 ``Start profiling.``; a refusal is a 500 with
        the scheduler's message, as the real server raises it."""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.app.engine is None:
            return self.send_json(503, None)
        ok, message = self.app.engine.profiler.start(body)
        return self.send_text(200, "Start profiling.\n") if ok else self.send_text(500, message)

    def stop_profile(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.app.engine is None:
            return self.send_json(503, None)
        ok, message = self.app.engine.profiler.stop()
        return self.send_text(200, "Stop profiling. This will take some time.\n") if ok else self.send_text(500, message)

    def send_text(self, code, text):
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def stream(self, request):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        sent = 0
        while sent < request.max_new_tokens:
            self.wait_for(request, lambda: request.completion_tokens > sent or request.finished)
            sent = request.completion_tokens
            self.wfile.write(f"data: {json.dumps(self.output(request))}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def wait_for(self, request, predicate):
        with self.app.engine.changed:
            self.app.engine.changed.wait_for(predicate)

    def output(self, request):
        meta = {"id": request.rid, "prompt_tokens": request.prompt_tokens,
                "completion_tokens": request.completion_tokens, "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": request.completion_tokens} if request.finished else None,
                "e2e_latency": round(time.monotonic() - request.created, 4)}
        if self.app.engine.spec:
            meta["spec_verify_ct"] = request.verify_ct
            meta["spec_accept_length"] = round(request.completion_tokens / max(request.verify_ct, 1), 4)
        return {"text": request.text(), "meta_info": meta}

    def send_json(self, code, payload):
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_request(self, code="-", size="-"):
        status = HTTPStatus(int(code)) if str(code).isdigit() else None
        phrase = f"{int(code)} {status.phrase}" if status else str(code)
        access_log.info(f'{self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {phrase}')

    def log_message(self, format, *args):
        pass


def server_info(server_args):
    """``GET /server_info``'s top level with the real SGLang's keys (snapshot of its ``build_server_info``):
    each resolved field of this server, the snapshot's value for the few keys that are not flags."""
    fields = vars(server_args)
    info = {key: fields.get(key, value) for key, value in load_snapshot("server_info.json")["info"].items()}
    info["launch_command"] = " ".join(sys.argv[1:])
    return info


def _prompt_tokens(body):
    if body.get("input_ids") is not None:
        return len(body["input_ids"])
    return max(1, len(str(body.get("text", "")).split()))


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048  # the real server's listen backlog (uvicorn's): 128 clients at once are not reset

    def __init__(self, app, host, port):
        self.app = app
        super().__init__((host, port), Handler)
