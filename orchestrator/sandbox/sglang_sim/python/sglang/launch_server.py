"""Launch the inference server: ``python -m sglang.launch_server --model-path PATH [--tp-size 8] ...``.

Still supported, with a ``UserWarning`` on stderr: ``sglang serve`` (``sglang/cli/main.py``) is the
recommended entrypoint and runs the same ``run_server``.
"""

import sys
import warnings

from sglang._sim.server import configure_logging, log_prefix, run
from sglang.srt.server_args import prepare_server_args


def run_server(server_args):
    """Serve with ``server_args`` (parsed, raw: resolved at launch) until SIGTERM; the exit status."""
    configure_logging(server_args.log_level, log_prefix(server_args))
    return run(server_args)


if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    server_args = prepare_server_args(sys.argv[1:])
    sys.exit(run_server(server_args))
