"""``sglang serve [MODEL] [--model-type {auto,llm,diffusion}] [flags]``: the language-model server of
``python -m sglang.launch_server`` (same parser, same run), without its UserWarning.

``--model-type`` (taken out of the argv before anything parses it) picks the backend; ``auto`` (the
default) detects it from the model and falls back to ``llm`` (no diffusion model exists here).
``--help`` with ``auto`` prints a general header, then the server's argparse help (prog ``sglang
serve``), then the (absent) diffusion server's; with a backend named, that backend's help only.
"""

from sglang.srt.server_args import prepare_server_args

BACKENDS = ("llm", "diffusion")
DIFFUSION_MISSING = 'Diffusion model support is not available. Install with: pip install "sglang[diffusion]"'


def _extract_model_type_override(extra_argv):
    """(backend name, the argv without ``--model-type X`` / ``--model-type=X``)."""
    backend_name, filtered = "auto", []
    args = iter(extra_argv)
    for arg in args:
        if arg == "--model-type":
            backend_name = next(args, None)
            if backend_name is None:
                raise ValueError("Error: --model-type requires a value.")
        elif arg.startswith("--model-type="):
            backend_name = arg.split("=", 1)[1]
        else:
            filtered.append(arg)
    if not backend_name:
        raise ValueError("Error: --model-type requires a non-empty value.")
    if backend_name != "auto" and backend_name not in BACKENDS:
        raise ValueError(f"Unknown serve backend {backend_name!r}. Available values: auto, {', '.join(BACKENDS)}.")
    return backend_name, filtered


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
        f"Optional override: --model-type {{auto,{','.join(BACKENDS)}}} "
        "(default: auto, fallback to LLM when no backend matches).\n"
        "Use `sglang serve --model-type BACKEND --help` for backend-specific help."
    )
    print("\n--- Help for Standard Language Model Server ---")
    _print_llm_help()
    print("\n--- Help for Diffusion Model Server ---")
    print(DIFFUSION_MISSING)


def serve(args, extra_argv):
    backend_name, argv = _extract_model_type_override(list(extra_argv))
    argv = _normalize_positional_model_path(argv)
    if any(h in argv for h in ("-h", "--help")):
        if backend_name == "auto":
            _print_general_help()
        elif backend_name == "llm":
            _print_llm_help()
        else:
            print(DIFFUSION_MISSING)
        return 0
    if backend_name == "diffusion":
        raise ImportError(DIFFUSION_MISSING)
    from sglang.launch_server import run_server

    return run_server(prepare_server_args(argv))
