"""Launch the inference server: ``python -m sglang.launch_server --model-path PATH [--tp-size 8] ...``."""

import sys

from sglang._sim.server import configure_logging, run
from sglang.srt.server_args import prepare_server_args

if __name__ == "__main__":
    configure_logging()
    server_args = prepare_server_args(sys.argv[1:])
    configure_logging(server_args.log_level)
    sys.exit(run(server_args))
