"""The SGLang server: its launch argv, the MTP rules, the host's flag list, and its HTTP answers.

Pure: builders of argv lists and checkers/parsers of what hosts print. Facts come from
``shared/reference/sglang.md`` §2. Log lines are in ``facts/server_log.py``; upstream test files
(``other_args``) in ``facts/server_upstream.py``.

Where the server listens: orch passes ``--port server_port`` and leaves ``--host`` to the recipe
(SGLang's default is 127.0.0.1). orch itself talks to the server from the host, through the SSH
connection, so an unexposed port works; ``probe_address`` says which address it uses.
"""

from __future__ import annotations

import difflib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import HostOutputError
from orchestrator.inventory import Host
from orchestrator.recipe import MTPSpec, Recipe

SERVER_MODULE = "sglang.launch_server"
# `sglang serve` picks a backend (LLM or diffusion) from the model unless told; orch names it, so the
# command it checks with `--help` is the command it launches.
SERVE_SUBCOMMAND = ("serve", "--model-type", "llm")
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
DEEPSEEK_V4 = "DeepseekV4ForCausalLM"
DEEPSEEK_V4_ALGORITHMS = ("EAGLE", "DSPARK")
DEEPSEEK_NEXTN_ARCHS = ("DeepseekV3ForCausalLM", DEEPSEEK_V4)
DEEPSEEK_DEFAULT_SPEC = (3, 1, 4)  # what SGLang picks for DeepSeek MTP when no number is given
# DSPARK drafts a block of gamma tokens in one step: SGLang forces steps 1 and topk 1 and verifies gamma + 1
# tokens; gamma is the draft checkpoint's, else DEFAULT_DSPARK_GAMMA
# (srt/speculative/dspark_components/dspark_config.py, reference §6.1).
DSPARK = "DSPARK"
DEFAULT_DSPARK_GAMMA = 7
HOST_SPECIFIC_FLAGS = ("model-path", "model", "port", "host")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe or a launch command: ``where`` (a recipe key or a flag) and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


# --- the launch command -------------------------------------------------------------------------


def serve_entrypoint(host: Host) -> list[str]:
    """``sglang serve`` (the recommended entrypoint): the console script next to the host's python
    (an absolute path, as the inventory requires)."""
    return [posixpath.join(posixpath.dirname(host.python), "sglang"), *SERVE_SUBCOMMAND]


def module_entrypoint(host: Host) -> list[str]:
    """``python -m sglang.launch_server``: older SGLang, or a host without the console script (it warns)."""
    return [host.python, "-m", SERVER_MODULE]


def entrypoints(host: Host) -> list[list[str]]:
    """The ways to start the server, preferred first; the host's own ``--help`` decides which it has.
    ``sglang serve`` only when its interpreter line runs the host's python literally (see
    ``console_script_is_literal``): otherwise ``python -m``, which orch starts without a shell."""
    if not console_script_is_literal(host.python):
        return [module_entrypoint(host)]
    return [serve_entrypoint(host), module_entrypoint(host)]


_SHELL_PLAIN = re.compile(r"^[A-Za-z0-9_./+,:@%=-]+$")


def console_script_is_literal(python: str) -> bool:
    """Whether the console scripts pip writes beside ``python`` start it without /bin/sh reading shell
    syntax in its path. pip (distlib) writes ``#!<python>`` when the path has no space and the line fits
    in 127 bytes (the kernel runs it: literal); else a ``/bin/sh`` trampoline with the path in double
    quotes when it has a space (``$``, backticks, ``\\`` and ``"`` are then live) or bare (everything is)."""
    if " " not in python and len(python.encode()) + 3 <= 127:
        return True
    if " " in python:
        return not any(c in python for c in '$`\\"')
    return bool(_SHELL_PLAIN.match(python))


def launch_argv(recipe: Recipe, host: Host, *, mtp: bool, entrypoint: Sequence[str] | None = None) -> list[str]:
    """The exact server command for ``host``: the entrypoint (default ``python -m sglang.launch_server``),
    then model, port, the recipe's arguments, the FP8 GEMM backend, and the speculative flags when
    ``mtp`` (and the recipe has an ``mtp`` block)."""
    argv = list(entrypoint or module_entrypoint(host))
    argv += ["--model-path", host.model_path, "--port", str(host.server_port)]
    argv += server_arg_flags(recipe.server_args)
    if recipe.fp8_gemm_backend:
        argv += ["--fp8-gemm-backend", recipe.fp8_gemm_backend]
    if mtp and recipe.mtp is not None:
        argv += mtp_flags(recipe.mtp)
    return argv


def split_entrypoint(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """A launch command as (entrypoint, the arguments SGLang's server parser reads)."""
    if argv[1:3] == ["-m", SERVER_MODULE]:
        return list(argv[:3]), list(argv[3:])
    size = 1 + len(SERVE_SUBCOMMAND)
    if tuple(argv[1:size]) == SERVE_SUBCOMMAND:
        return list(argv[:size]), list(argv[size:])
    raise ValueError(f"not an SGLang server command: {' '.join(argv[:4])} ...")


def entrypoint_name(argv: Sequence[str]) -> str:
    """``sglang serve`` or ``python -m sglang.launch_server``: which entrypoint a launch command used."""
    entry, _ = split_entrypoint(argv)
    return "sglang serve" if entry[1] == SERVE_SUBCOMMAND[0] else f"python -m {SERVER_MODULE}"


def server_arg_flags(args: Mapping[str, str | int | float | bool]) -> list[str]:
    """``{"tp": 8, "trust-remote-code": true, "x": false}`` → ``["--tp", "8", "--trust-remote-code"]``:
    true is a bare flag, false leaves the flag out, anything else is the flag and its value."""
    flags: list[str] = []
    for name, value in args.items():
        if value is True:
            flags.append(f"--{name}")
        elif value is not False:
            flags += [f"--{name}", str(value)]
    return flags


def mtp_flags(spec: MTPSpec) -> list[str]:
    """The ``--speculative-*`` flags of an MTP block, only the numbers it gives. The algorithm is sent
    upper-case: DeepSeek-V4's model hook checks the raw string before SGLang upper-cases it."""
    flags = ["--speculative-algorithm", spec.algorithm.upper()]
    for flag, value in (
        ("--speculative-num-steps", spec.num_steps),
        ("--speculative-eagle-topk", spec.eagle_topk),
        ("--speculative-num-draft-tokens", spec.num_draft_tokens),
        ("--speculative-draft-model-path", spec.draft_model_path),
    ):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def server_gpus(recipe: Recipe, host: Host) -> list[int]:
    """GPU indexes the server uses: ``base-gpu-id`` .. + tp * dp (capped by the host's GPUs), where dp
    counts replicas: ``--dp-size N --enable-dp-attention`` is attention-DP inside the tp GPUs (SGLang
    resolves it to ``attn_dp_size = N``, ``dp_size = 1``; reference §6.1)."""
    return [i for i in needed_gpus(recipe) if i < host.gpus]


def needed_gpus(recipe: Recipe) -> list[int]:
    """GPU indexes the recipe's server needs (``base-gpu-id`` .. + tp * replicas), whatever the host has:
    the replacement check compares them with the GPUs nvidia-smi shows."""
    args = recipe.server_args
    tp = recipe_tp_size(recipe, 1)
    base = int_arg(args, ("base-gpu-id",), 0)
    return list(range(base, base + tp * dp_replicas(recipe)))


def dp_replicas(recipe: Recipe) -> int:
    """The data-parallel replicas SGLang runs (each on tp GPUs): ``dp-size``, except that the deprecated
    ``--enable-dp-attention`` without ``--attn-dp-size`` turns it into attention-DP and runs one replica
    (``parallel_hook.handle_deprecated_dp_attention``)."""
    args = recipe.server_args
    dp = int_arg(args, ("dp", "dp-size", "data-parallel-size"), 1)
    if args.get("enable-dp-attention") is True and int_arg(args, ("attn-dp-size",), 1) == 1:
        return 1
    return dp


def attention_dp(recipe: Recipe) -> int:
    """The attention-DP width: ``attn-dp-size``, or ``dp-size`` under ``--enable-dp-attention``; 1: none."""
    args = recipe.server_args
    explicit = int_arg(args, ("attn-dp-size",), 1)
    if explicit == 1 and args.get("enable-dp-attention") is True:
        return int_arg(args, ("dp", "dp-size", "data-parallel-size"), 1)
    return explicit


def recipe_tp_size(recipe: Recipe, default: int) -> int:
    """The recipe's tensor-parallel size (``tp``, ``tp-size`` or ``tensor-parallel-size``), else ``default``."""
    return int_arg(recipe.server_args, ("tp", "tp-size", "tensor-parallel-size"), default)


def int_arg(args: Mapping[str, Any], names: Sequence[str], default: int) -> int:
    """The first of flags ``names`` the server arguments give (a whole number: ``recipe.SIZE_FLAGS``), else
    ``default``; ``false`` (a profile dropping the flag) counts as not given."""
    for name in names:
        if name in args and not isinstance(args[name], bool):
            return int(args[name])
    return default


def probe_address(recipe: Recipe) -> str:
    """Where orch, on the host, reaches the server: the address it binds, or loopback for a wildcard."""
    return _reachable(recipe_bind_address(recipe))


def recipe_bind_address(recipe: Recipe) -> str:
    """The address the recipe's server binds: its ``host``, else SGLang's default 127.0.0.1."""
    return str(recipe.server_args.get("host", "127.0.0.1"))


def flag_int(argv: Sequence[str], flag: str) -> int | None:
    """The number a server command gives ``flag`` (its last ``FLAG N``), None without one."""
    found = None
    for i, arg in enumerate(argv[:-1]):
        if arg == flag and argv[i + 1].isdigit():
            found = int(argv[i + 1])
    return found


def argv_address(argv: Sequence[str]) -> str:
    """``probe_address`` for a server already launched, from its command line (``--host``)."""
    return _reachable(bind_address(argv) or "127.0.0.1")


def bind_address(argv: Sequence[str]) -> str | None:
    """The address a server command binds: the value of its last ``--host ADDR`` / ``--host=ADDR``
    (SGLang's parser keeps the last), None without one (SGLang then binds 127.0.0.1)."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--host="):
            found = arg.split("=", 1)[1]
    return found


def _reachable(bound: str) -> str:
    return "127.0.0.1" if bound in ("0.0.0.0", "::", "", "localhost") else bound


def base_url(recipe: Recipe, host: Host) -> str:
    return url(probe_address(recipe), host.server_port)


def url(address: str, port: int) -> str:
    return f"http://{f'[{address}]' if ':' in address else address}:{port}"


# --- the MTP rules (reference §2) -----------------------------------------------------------------


def check_recipe(recipe: Recipe, *, mtp: bool) -> list[Problem]:
    """Every reason SGLang would refuse the recipe's speculative settings, or silently change them.

    Empty means fine. Without ``mtp`` nothing speculative is passed, so nothing is checked.
    """
    if not mtp:
        return []
    if recipe.mtp is None:
        return [Problem("mtp", "MTP was asked for but the recipe has no `mtp:` block (or serve with --no-mtp)")]
    spec, problems = recipe.mtp, []
    problems += _check_algorithm(spec.algorithm, recipe.architecture, spec.eagle_topk)
    if spec.algorithm.upper() == DSPARK:
        return problems + _check_dspark(spec, recipe)
    return problems + _check_numbers(spec)


def _check_algorithm(name: str, architecture: str, topk: int | None) -> list[Problem]:
    upper = name.upper()
    if upper == "MTP":
        return [
            Problem(
                "mtp.algorithm",
                "`MTP` is not an SGLang algorithm name (it fails with `Unknown "
                "speculative algorithm name: MTP`); DeepSeek MTP is `EAGLE`",
            )
        ]
    if upper not in SPECULATIVE_ALGORITHMS:
        return [
            Problem(
                "mtp.algorithm",
                f"unknown speculative algorithm {name!r}; SGLang knows {', '.join(SPECULATIVE_ALGORITHMS)}",
            )
        ]
    if architecture == DEEPSEEK_V4:
        return _check_deepseek_v4(upper, topk)
    return []


def _check_deepseek_v4(upper: str, topk: int | None) -> list[Problem]:
    if upper == "NEXTN":
        return [
            Problem(
                "mtp.algorithm",
                "pass `EAGLE`, not `NEXTN`, for DeepSeek-V4: SGLang checks the "
                "algorithm before it maps NEXTN to EAGLE, and refuses NEXTN",
            )
        ]
    if upper not in DEEPSEEK_V4_ALGORITHMS:
        return [Problem("mtp.algorithm", f"DeepSeek-V4 supports only EAGLE or DSPARK, not {upper}")]
    if upper == "EAGLE" and topk != 1:
        got = "not given" if topk is None else f"{topk}"
        return [Problem("mtp.eagle_topk", f"DeepSeek-V4 with EAGLE needs eagle_topk 1 given explicitly ({got})")]
    return []


def _check_numbers(spec: MTPSpec) -> list[Problem]:
    numbers = {"num_steps": spec.num_steps, "eagle_topk": spec.eagle_topk, "num_draft_tokens": spec.num_draft_tokens}
    missing = [k for k, v in numbers.items() if v is None]
    if missing and len(missing) < len(numbers):
        return [
            Problem(
                "mtp",
                f"give num_steps, eagle_topk and num_draft_tokens all or none (missing: "
                f"{', '.join(missing)}); SGLang refuses a partial set",
            )
        ]
    if spec.eagle_topk == 1 and spec.num_steps is not None and spec.num_draft_tokens != spec.num_steps + 1:
        return [
            Problem(
                "mtp.num_draft_tokens",
                f"with eagle_topk 1 SGLang forces draft tokens to num_steps + 1 "
                f"= {spec.num_steps + 1} (got {spec.num_draft_tokens}); write {spec.num_steps + 1}",
            )
        ]
    return []


def _check_dspark(spec: MTPSpec, recipe: Recipe) -> list[Problem]:
    """DSPARK's own rules (``speculative_hook._handle_dspark``): one step of topk 1 (SGLang overrides other
    numbers with a warning), gamma + 1 >= 2 draft tokens, and ``--enable-dp-lm-head`` under DP attention.
    The draft model: the recipe's ``draft_model_path``, else a ``dspark/`` draft bundled in the model
    directory (SGLang refuses to start with neither)."""
    problems = [
        Problem(f"mtp.{key}", f"DSPARK runs {key} 1: SGLang overrides {value} with 1; write 1 or leave it out")
        for key, value in (("num_steps", spec.num_steps), ("eagle_topk", spec.eagle_topk))
        if value not in (None, 1)
    ]
    draft = spec.num_draft_tokens
    if draft is not None and draft < 2:
        problems.append(Problem("mtp.num_draft_tokens", f"DSPARK verifies gamma + 1 >= 2 tokens (got {draft})"))
    if attention_dp(recipe) > 1 and recipe.server_args.get("enable-dp-lm-head") is not True:
        problems.append(Problem("server_args", "DSPARK with DP attention needs `enable-dp-lm-head: true`"))
    return problems


# --- the host's flag list (`sglang serve --model-type llm --help`) ------------------------------


def help_argv(entrypoint: Sequence[str]) -> list[str]:
    return [*entrypoint, "--help"]


# The option strings the server's parser really matches against, hidden ones (help=SUPPRESS) included:
# argparse counts them for prefixes and ambiguity, and `--help` does not list them. Built the way
# SGLang's `prepare_server_args` builds its parser; prints one JSON object {option: choices or null}.
_PARSER_SNIPPET = r"""
import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
print(json.dumps({o: None if a.choices is None else [str(c) for c in a.choices]
                  for a in parser._actions for o in a.option_strings}))
"""


def parser_argv(python: str) -> list[str]:
    """Ask the host's SGLang for its server parser's every option string (see ``parse_parser``)."""
    return [python, "-c", _PARSER_SNIPPET]


def parse_parser(stdout: str) -> dict[str, tuple[str, ...] | None] | None:
    """``parser_argv``'s answer as ``parse_help`` gives it; None when it is not one (drifted upstream)."""
    try:
        options = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except json.JSONDecodeError:
        return None
    if not isinstance(options, dict) or "--model-path" not in options:
        return None
    return {str(o): None if c is None else tuple(map(str, c)) for o, c in options.items()}


# Parses argv[1] (a JSON list: a launch command's server flags) with the server's parser, built as above;
# prints {"refused": argparse's message, or null when it parses}.
_PARSE_SNIPPET = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
class Refused(Exception):
    pass
def refuse(message):
    raise Refused(message)
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
parser.error = refuse
try:
    parser.parse_args(json.loads(sys.argv[1]))
except Refused as exc:
    print(json.dumps({"refused": str(exc)}))
else:
    print(json.dumps({"refused": None}))
"""


def parse_check_argv(python: str, flags: Sequence[str]) -> list[str]:
    """Have the host's server parser parse ``flags`` as a launch would first (``parse_refusal`` reads it):
    argparse converts each value to its flag's type (``--mem-fraction-static lots`` exits 2), which the
    option list (``parser_argv``) cannot tell."""
    return [python, "-c", _PARSE_SNIPPET, json.dumps(list(flags))]


def parse_refusal(stdout: str) -> str | None:
    """``parse_check_argv``'s answer: argparse's message when the parser refuses the flags; None when it
    parses them, or when the answer is not one (an SGLang that drifted: the launch itself then tells)."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None
    except json.JSONDecodeError:
        return None
    refused = answer.get("refused") if isinstance(answer, dict) else None
    return str(refused) if refused else None


_OPTION_INDENT = 6  # argparse indents options by 2 (4 in nested groups), their help by 24
_FLAG_IN_HELP = re.compile(r"^(--[A-Za-z0-9][A-Za-z0-9_-]*)(?:[ =](\{[^}]*\}))?")


def parse_help(text: str) -> dict[str, tuple[str, ...] | None]:
    """Every ``--flag`` argparse lists in ``--help``, with its choices (``{a,b}``) or None.

    Only the option column counts (lines starting with ``-`` after a short indentation, up to the help
    text), so a flag merely mentioned in a description is not taken for one the server accepts.
    """
    flags: dict[str, tuple[str, ...] | None] = {}
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not 0 < indent <= _OPTION_INDENT or not stripped.startswith("-"):
            continue
        invocation = re.split(r"\s{2,}", stripped, maxsplit=1)[0]
        for part in invocation.split(", "):
            m = _FLAG_IN_HELP.match(part)
            if m:
                flags[m[1]] = tuple(m[2][1:-1].split(",")) if m[2] else None
    return flags


def matching_options(flag: str, known: Iterable[str]) -> list[str]:
    """The option strings ``flag`` stands for under argparse's rules (SGLang's parser keeps
    ``allow_abbrev``): itself when it is one (an option or an alias), else every option it is a prefix
    of, in the order ``--help`` lists them. One: accepted; several: SGLang exits 2 ("ambiguous option");
    none: unknown."""
    options = list(known)
    if flag in options:
        return [flag]
    return [o for o in options if o.startswith(flag)]


def canonical_flag(name: str, known: Iterable[str]) -> str:
    """``tp`` → ``tp-size`` when ``--tp`` stands for exactly one option (as argparse reads it); else ``name``."""
    matches = matching_options(f"--{name}", known)
    return matches[0][2:] if len(matches) == 1 and matches[0].startswith("--") else name


def check_flags(argv: Sequence[str], known: Mapping[str, tuple[str, ...] | None]) -> list[Problem]:
    """Flags in ``argv`` the host's SGLang would refuse (unknown, with a close match as upstream renames
    flags, or an ambiguous abbreviation, with its candidates), and values outside a flag's choices."""
    problems = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        flag, _, inline = arg.partition("=")
        matches = matching_options(flag, known)
        if len(matches) != 1:
            problems.append(Problem(flag, _ambiguous_reason(matches) if matches else _unknown_reason(flag, known)))
            continue
        value = inline or (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None)
        choices = known[matches[0]]
        if choices and value is not None and value not in choices:
            problems.append(Problem(flag, f"the host's SGLang accepts only {', '.join(choices)} (got {value!r})"))
    return problems


def _ambiguous_reason(candidates: Sequence[str]) -> str:
    return (
        f"ambiguous: SGLang refuses an abbreviation that could match {', '.join(candidates)} (exit 2); "
        "write the full flag name"
    )


# Names are compared without their dashes, which made `--tp` and `--ep` (or `--help`) look 75-80% alike:
# a hint must never propose an unrelated flag.
_HINT_CUTOFF = 0.8


def _unknown_reason(flag: str, known: Iterable[str]) -> str:
    names = {option.lstrip("-"): option for option in known}
    close = difflib.get_close_matches(flag.lstrip("-"), list(names), n=1, cutoff=_HINT_CUTOFF)
    hint = f"; did upstream rename it to {names[close[0]]}?" if close else ""
    return f"the host's SGLang does not know this flag (not in its server's `--help`){hint}"


# --- HTTP, asked from the host ----------------------------------------------------------------------

# argv[1] is a JSON list of [method, url, body-or-null, timeout]; prints a JSON list of
# {"status": int (0 = no answer), "body": text}. One process and one SSH channel for several requests.
_HTTP = r"""
import json, sys, urllib.error, urllib.request
answers = []
for method, url, body, timeout in json.loads(sys.argv[1]):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            answers.append({"status": r.status, "body": r.read().decode("utf-8", "replace")})
    except urllib.error.HTTPError as e:
        answers.append({"status": e.code, "body": e.read().decode("utf-8", "replace")})
    except Exception as e:
        answers.append({"status": 0, "body": "%s: %s" % (type(e).__name__, e)})
print(json.dumps(answers))
"""


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    body: Any = None
    timeout: float = 10.0


@dataclass(frozen=True)
class HttpAnswer:
    status: int  # 0: no answer (connection refused, timeout)
    body: str

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def http_argv(python: str, requests: Sequence[HttpRequest]) -> list[str]:
    """Run ``requests`` in order from the host with its own python (no curl needed, nothing exposed)."""
    payload = [[r.method, r.url, r.body, r.timeout] for r in requests]
    return [python, "-c", _HTTP, json.dumps(payload)]


class HttpOutputError(HostOutputError, ValueError):
    """The HTTP probe printed something that is not its answers (a ValueError too, for its callers)."""


def parse_http(stdout: str) -> list[HttpAnswer]:
    """Answers of ``http_argv``; raises ``HttpOutputError`` on output that is not the snippet's."""
    try:
        answers = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError, RecursionError):
        answers = None
    valid = isinstance(answers, list) and all(
        isinstance(a, dict) and type(a.get("status")) is int and "body" in a for a in answers
    )
    if not valid:
        raise HttpOutputError(f"unexpected output of the HTTP probe: {stdout.strip()[:200]!r}")
    return [HttpAnswer(a["status"], str(a["body"])) for a in answers]


def generate_request(url: str, max_new_tokens: int, index: int, timeout: float = 120.0) -> HttpRequest:
    """A short deterministic ``POST /generate`` used to probe a fresh server."""
    body = {
        "text": f"orch probe {index}: write a short story about a GPU that learns to count.",
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
    }
    return HttpRequest("POST", f"{url}/generate", body, timeout)


# --- /server_info ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecSettings:
    """Speculative settings as SGLang resolved them (``algorithm`` None: speculative decoding off)."""

    algorithm: str | None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    def __str__(self) -> str:
        if self.algorithm is None:
            return "off"
        return f"{self.algorithm} steps={self.num_steps} topk={self.eagle_topk} draft={self.num_draft_tokens}"


def spec_settings(info: Mapping[str, Any]) -> SpecSettings:
    """The speculative settings of a ``GET /server_info`` answer; ``HostOutputError`` when the
    answer is not an object or a setting is not what SGLang reports (a string, whole numbers)."""
    if not isinstance(info, Mapping):
        raise HostOutputError(f"/server_info answered {type(info).__name__}, not an object")
    algorithm = info.get("speculative_algorithm")
    if algorithm in (None, "", "NONE", "None"):
        return SpecSettings(None)
    if not isinstance(algorithm, str):
        raise HostOutputError(f"/server_info: speculative_algorithm {_shown(algorithm)} is not a name")
    return SpecSettings(
        algorithm,
        *(_opt_int(info, f"speculative_{k}") for k in ("num_steps", "eagle_topk", "num_draft_tokens")),
    )


def _opt_int(info: Mapping[str, Any], key: str) -> int | None:
    value = info.get(key)
    if value is None:
        return None
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise HostOutputError(f"/server_info: {key} {_shown(value)} is not a whole number")


def _shown(value: Any) -> str:
    text = repr(value)
    return text[:80] + "…" if len(text) > 80 else text


def expected_spec(recipe: Recipe, *, mtp: bool) -> SpecSettings:
    """What ``/server_info`` must say: off without MTP; else the recipe's algorithm as SGLang names it
    (NEXTN → EAGLE), its numbers, SGLang's (3, 1, 4) for DeepSeek when none is given, and draft tokens
    forced to steps + 1 with topk 1; DSPARK runs one step of topk 1 and gamma + 1 draft tokens."""
    if not mtp or recipe.mtp is None:
        return SpecSettings(None)
    spec = recipe.mtp
    algorithm = "EAGLE" if spec.algorithm.upper() == "NEXTN" else spec.algorithm.upper()
    if algorithm == DSPARK:
        return SpecSettings(DSPARK, 1, 1, _dspark_draft_tokens(recipe))
    steps, topk, draft = spec.num_steps, spec.eagle_topk, spec.num_draft_tokens
    if steps is None and topk is None and draft is None and recipe.architecture in DEEPSEEK_NEXTN_ARCHS:
        steps, topk, draft = DEEPSEEK_DEFAULT_SPEC
    if topk == 1 and steps is not None:
        draft = steps + 1
    return SpecSettings(algorithm, steps, topk, draft)


def _dspark_draft_tokens(recipe: Recipe) -> int | None:
    """DSPARK's draft tokens: as given (SGLang refuses a launch whose draft checkpoint names another
    gamma); else None, not checked: the draft checkpoint's gamma decides, ``DEFAULT_DSPARK_GAMMA`` when it
    names none (8 draft tokens)."""
    assert recipe.mtp is not None
    return recipe.mtp.num_draft_tokens


def check_spec(actual: SpecSettings, expected: SpecSettings) -> list[Problem]:
    """Differences between what the server runs and what was asked (a number not asked is not checked)."""
    if expected.algorithm is None:
        return (
            []
            if actual.algorithm is None
            else [
                Problem("speculative_algorithm", f"speculative decoding is on ({actual}) although it was not asked for")
            ]
        )
    if actual.algorithm != expected.algorithm:
        shown = actual.algorithm or "off (None)"
        return [Problem("speculative_algorithm", f"the server runs {shown}, expected {expected.algorithm}")]
    problems = []
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        want, got = getattr(expected, key), getattr(actual, key)
        if want is not None and got != want:
            problems.append(Problem(f"speculative_{key}", f"the server runs {got}, expected {want}"))
    return problems


# `--fp8-gemm-backend` sets the field `fp8_gemm_runner_backend`, the key /server_info answers; the first
# version of orch read `fp8_gemm_backend`, which SGLang 0.5.23 does not have (kept as a fallback).
FP8_BACKEND_KEYS = ("fp8_gemm_runner_backend", "fp8_gemm_backend")


def fp8_backend(info: Mapping[str, Any]) -> str | None:
    """The FP8 GEMM backend a ``/server_info`` answer reports, or None when it reports none."""
    if not isinstance(info, Mapping):
        return None
    return next((info[k] for k in FP8_BACKEND_KEYS if isinstance(info.get(k), str)), None)


def auto_is_cutlass(backend: str | None, compute_cap: str | None, shape: tuple[int, int] | None = None) -> bool:
    """Whether ``auto`` (or no backend named) runs block-FP8 GEMMs on CUTLASS: on sm_120 it does, for
    every shape whose N and K are multiples of 128, and never reads the tuned Triton configs; ``auto``
    stays ``"auto"`` in ``/server_info`` all the same (reference §1.2)."""
    on_sm120 = backend in (None, "auto") and (compute_cap or "").startswith("12.")
    return on_sm120 and (shape is None or all(d % 128 == 0 for d in shape))


def backend_runs(reported: str | None, compute_cap: str | None) -> str:
    """What runs the block-FP8 GEMMs, in words."""
    name = reported or "not reported"
    if auto_is_cutlass(reported, compute_cap):
        return f"{name} = CUTLASS on sm_120 (tuned Triton configs unused)"
    if reported == "cutlass":
        return "cutlass (tuned Triton configs unused)"
    return name


def check_backend(info: Mapping[str, Any], wanted: str | None) -> list[Problem]:
    """The FP8 GEMM backend the server resolved, when the recipe asks for one: a server that does not
    report one is a problem too (the check must be able to fail)."""
    if wanted is None:
        return []
    got = fp8_backend(info)
    if got == wanted:
        return []
    shown = "reports no FP8 GEMM backend" if got is None else f"runs {got!r}"
    return [Problem(FP8_BACKEND_KEYS[0], f"the server {shown}, expected {wanted!r}")]


# --- what SGLang resolves at launch beyond the argv (reference §6.1) ------------------------------------

RESOLVED_SETTINGS = ("moe_runner_backend", "attention_backend", "page_size", "max_running_requests")
AUTO = "auto"
_MXFP4_MOE_CAPS = ("9.", "10.", "12.")  # sm90, sm100/103, sm120


def asked_settings(recipe: Recipe) -> dict[str, str]:
    """What the recipe asks of each setting SGLang resolves at launch: its ``server_args`` value, else auto."""
    return {key: str(recipe.server_args.get(key.replace("_", "-"), AUTO)) for key in RESOLVED_SETTINGS}


def expected_settings(recipe: Recipe, compute_cap: str | None) -> dict[str, str]:
    """What SGLang resolves for a DeepSeek-V4 launch on a CUDA GPU of ``compute_cap`` (the model hook,
    ``model_overrides/deepseek_v4.py`` and ``deepseek_v4_hook.py``): the ``dsv4`` attention backend with
    256-token pages, at most 256 running requests, and the ``flashinfer_mxfp4`` MoE runner on sm90/100/120
    (FP4 experts, as the released checkpoint has, and no MoE all-to-all backend); what the recipe names
    explicitly wins. Other models: what the recipe asks (auto: SGLang's own choice, not predicted here)."""
    asked = asked_settings(recipe)
    if recipe.architecture != DEEPSEEK_V4:
        return asked
    predicted = {"attention_backend": "dsv4", "page_size": "256", "max_running_requests": "256"}
    no_a2a = str(recipe.server_args.get("moe-a2a-backend", "none")) == "none"
    if no_a2a and (compute_cap or "").startswith(_MXFP4_MOE_CAPS):
        predicted["moe_runner_backend"] = "flashinfer_mxfp4"
    return {key: value if value != AUTO else predicted.get(key, AUTO) for key, value in asked.items()}


def check_settings(resolved: Mapping[str, str], expected: Mapping[str, str]) -> list[Problem]:
    """Settings the server says it resolved (its log) other than expected; a setting it did not log, or
    one expected as auto, is not checked."""
    return [
        Problem(key, f"the server resolved {resolved[key]}, expected {want}")
        for key, want in expected.items()
        if want != AUTO and key in resolved and resolved[key] != want
    ]


_SETTING_LABELS = {
    "moe_runner_backend": "MoE runner",
    "attention_backend": "attention",
    "page_size": "page size",
    "max_running_requests": "max running requests",
    "fp8_gemm_backend": "FP8 GEMM",
}


def settings_line(resolved: Mapping[str, str], asked: Mapping[str, str]) -> str:
    """``MoE runner flashinfer_mxfp4 (asked auto), attention dsv4 (asked auto), ...``: what the server
    resolved beside what the recipe asked, in a fixed order; a setting the log did not show is "not logged"."""
    parts = []
    for key, label in _SETTING_LABELS.items():
        if key in resolved or key in asked:
            parts.append(f"{label} {resolved.get(key, 'not logged')} (asked {asked.get(key, AUTO)})")
    return ", ".join(parts)


def is_simulated(info: Mapping[str, Any]) -> bool:
    """Whether ``/server_info`` says orch's simulated SGLang answers (its ``"simulated"`` key, which the real
    server never writes): the accept length it reports, and the load of its GPUs, are a model's."""
    return isinstance(info, Mapping) and bool(info.get("simulated"))


def avg_accept_length(info: Mapping[str, Any]) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` (absent until the first decode log interval)."""
    states = info.get("internal_states") if isinstance(info, Mapping) else None
    if not isinstance(states, list) or not states or not isinstance(states[0], dict):
        return None
    value = states[0].get("avg_spec_accept_length")
    return float(value) if isinstance(value, int | float) else None


def generate_accept_length(answer: HttpAnswer) -> float | None:
    """``meta_info.spec_accept_length`` of one ``POST /generate`` answer, when it has one."""
    body = answer.json() if answer.status == 200 else None
    meta = body.get("meta_info") if isinstance(body, dict) else None
    value = meta.get("spec_accept_length") if isinstance(meta, dict) else None
    return float(value) if isinstance(value, int | float) else None
