"""``sglang serve [MODEL] [flags]``: the language-model server of ``python -m sglang.launch_server``
(same parser, same run), without its UserWarning. ``--help`` prints a general header, then the
server's argparse help (prog ``sglang serve``), then the (absent) diffusion server's."""

from sglang.srt.server_args import prepare_server_args


def _normalize_positional_model_path(extra_argv):
    """Allow ``sglang serve <model>`` besides ``--model-path <model>``."""
    if extra_argv and not extra_argv[0].startswith("-"):
        return ["--model-path", extra_argv[0], *extra_argv[1:]]
    return extra_argv


def _print_llm_help():
    try:
        prepare_server_args(["--help"])
    except SystemExit:
        pass  # argparse's --help exits


def _print_general_help():
    print(
        "Usage: sglang serve <model-name-or-path> [additional-arguments]\n"
        "   or: sglang serve --model-path <model-name-or-path> [additional-arguments]\n\n"
        "The serving backend is detected from the model by default.\n"
        "Optional override: --model-type {auto,llm,diffusion} "
        "(default: auto, fallback to LLM when no backend matches)."
    )
    print("\n--- Help for Standard Language Model Server ---")
    _print_llm_help()
    print("\n--- Help for Diffusion Model Server ---")
    print('Diffusion model support is not available. Install with: pip install "sglang[diffusion]"')


def serve(args, extra_argv):
    argv = _normalize_positional_model_path(list(extra_argv))
    if any(h in argv for h in ("-h", "--help")):
        _print_general_help()
        return 0
    from sglang.launch_server import run_server

    return run_server(prepare_server_args(argv))
