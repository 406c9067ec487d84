"""Today's gateway (``smg`` 1.13.0) beside its predecessor (``sglang-router`` 0.3.2) (issue 23 §4).

The launcher imports ``smg`` first and ``sglang_router`` second, in the one process that runs the
gateway; ``POST /workers`` of a URL the gateway already has is "already registered", whichever of 202
(0.3.2) or 409 (1.13.0, the bodies below as it answered them on loopback) it answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.errors import GatewayError
from orchestrator.gateway import SMG_LAUNCHER, GatewayClient, conflict_code
from orchestrator.inventory import Gateway

FAKE_LAUNCH_ROUTER = """
import argparse
def parse_router_args(argv):
    return argparse.Namespace(argv=argv, api_key=None)
def launch_router(args):
    print(__name__, args.argv, args.api_key)
"""


def fake_package(root: Path, package: str) -> None:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "launch_router.py").write_text(FAKE_LAUNCH_ROUTER)


def launch(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(root), "GW_KEY": "s3cret", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", SMG_LAUNCHER, *argv], env=env, capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("packages", "chosen"),
    [(["smg", "sglang_router"], "smg.launch_router"), (["smg"], "smg.launch_router"),
     (["sglang_router"], "sglang_router.launch_router")],
)  # fmt: skip
def test_the_launcher_runs_smg_first_else_sglang_router(tmp_path: Path, packages: list[str], chosen: str) -> None:
    for package in packages:
        fake_package(tmp_path, package)
    run = launch(tmp_path, "GW_KEY", "--port", "9")
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{chosen} ['--port', '9'] s3cret\n"


def test_the_launcher_without_either_package_says_so_in_one_line(tmp_path: Path) -> None:
    run = launch(tmp_path, "", "--port", "9")
    assert run.returncode == 1
    assert run.stderr == (
        f"orch: {sys.executable} has neither smg nor sglang-router installed: "
        "pip install smg (the SGLang Model Gateway)\n"
    )


def test_a_broken_smg_install_is_not_hidden_behind_sglang_router(tmp_path: Path) -> None:
    fake_package(tmp_path, "sglang_router")
    fake_package(tmp_path, "smg")
    (tmp_path / "smg" / "launch_router.py").write_text("import smg_rs_missing\n")
    run = launch(tmp_path, "", "--port", "9")
    assert run.returncode == 1 and "No module named 'smg_rs_missing'" in run.stderr


# smg 1.13.0's answers to POST /workers of a URL it has (registered; queued by an earlier request)
EXISTS = {"error": "Worker already exists at URL 'http://127.0.0.1:39187' with ID 01a23b2f-fb5d-716a-8d5b-f3b5c3547b82."
          " Use PUT /workers/01a23b2f-fb5d-716a-8d5b-f3b5c3547b82 to replace or PATCH /workers/"
          "01a23b2f-fb5d-716a-8d5b-f3b5c3547b82 to update.", "code": "WORKER_ALREADY_EXISTS"}  # fmt: skip
IN_PROGRESS = {"error": "Worker creation already in progress for URL 'http://127.0.0.1:39187' with ID "
               "01a23b2f-fb5d-716a-8d5b-f3b5c3547b82. Poll GET /workers/01a23b2f-fb5d-716a-8d5b-f3b5c3547b82.",
               "code": "WORKER_CREATE_IN_PROGRESS"}  # fmt: skip
WORKER = {"id": "01a23b2f-fb5d-716a-8d5b-f3b5c3547b82", "url": "http://127.0.0.1:39187", "model_id": "m",
          "is_healthy": True, "status": "ready", "load": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "code"),
    [(json.dumps(EXISTS), "WORKER_ALREADY_EXISTS"), (json.dumps(IN_PROGRESS), "WORKER_CREATE_IN_PROGRESS"),
     ("", ""), ("[1]", ""), ('{"code": 7}', "")],
)  # fmt: skip
def test_the_code_of_a_409_is_read_from_its_body(body: str, code: str) -> None:
    assert conflict_code(body) == code


def fake_gateway(post_status: int, post_body: object, listed: list[object]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer(post_status, post_body)

        def do_GET(self) -> None:
            self._answer(200, {"workers": listed, "total": len(listed)})

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "listed", "expected"),
    [(409, EXISTS, [WORKER], WORKER["id"]), (409, IN_PROGRESS, [], None),
     (202, {"status": "accepted", "worker_id": WORKER["id"]}, [], WORKER["id"])],
)  # fmt: skip
def test_adding_a_url_the_gateway_already_has_is_already_registered(
    status: int, body: object, listed: list[object], expected: str | None
) -> None:
    for base in fake_gateway(status, body, listed):
        assert GatewayClient(Gateway(url=base), {}).add("http://127.0.0.1:39187") == expected


def test_another_409_is_still_an_error_naming_its_code() -> None:
    for base in fake_gateway(409, {"error": "no", "code": "SOMETHING_ELSE"}, []):
        with pytest.raises(GatewayError, match=r"POST /workers answered HTTP 409 \(SOMETHING_ELSE\)$"):
            GatewayClient(Gateway(url=base), {}).add("http://127.0.0.1:39187")
