"""Model recipes (playbooks): one YAML per model under ``playbooks/``, validated at the boundary.

A recipe says how to serve a model (base launch arguments, the MTP block, the FP8 GEMM backend),
what to expect of it (minimum accept length), which GEMM shapes to tune, how to benchmark it, and the
``steps`` of the campaign ``orch run`` walks through. Each step's options use the same models as the
single commands (``TuneOptions`` for ``orch tune-fp8``, ...): one code path per step.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import ConfigError
from orchestrator.text import find_secret, is_env_name, looks_secret
from orchestrator.tuning_record import STUCK_AFTER_S
from orchestrator.tuning_record import Shape as Shape  # the one shape type, re-exported: the playbook's shapes
from orchestrator.yamlfile import YamlModel, control_character, did_you_mean, load_yaml, read_text

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
MAX_BATCH_SIZE = 65536
"""The largest batch size (the GEMM's M, in tokens) orch tunes. SGLang reads the tuned config whose M is nearest
a batch's, and its batches are far smaller (prefills run in chunks of ``--chunked-prefill-size`` tokens, a few
thousand by default): a larger M's config would never be read, and tuning it keeps a GPU busy for nothing (a
typo's extra zeros, most often)."""


def check_batch_size(m: int) -> int:
    """``m`` when it is a batch size orch tunes, else a ``ValueError`` saying why."""
    if m < 1:
        raise ValueError(f"{m} is not a batch size: a batch holds 1 token or more")
    if m > MAX_BATCH_SIZE:
        raise ValueError(
            f"{m} is larger than {MAX_BATCH_SIZE}, the largest batch size orch tunes: SGLang's batches are far "
            "smaller (prefill chunks of --chunked-prefill-size tokens), so it would never read that config"
        )
    return m


BatchSizes = Annotated[list[Annotated[int, AfterValidator(check_batch_size)]], AfterValidator(lambda m: sorted(set(m)))]
"""Batch sizes to tune, in order and each once (what ``--batch-sizes 8,1,8`` makes too: a size given twice is
tuned once)."""
DEFAULT_RECIPE = "deepseek-v4-flash"
DEFAULT_HEALTH_TIMEOUT = 1200.0
# The shipped playbooks: package data in an installed wheel; in a checkout the symlink
# orchestrator/playbooks resolves to the repository's playbooks/. Searched after ./playbooks.
PACKAGED_PLAYBOOKS = (Path(__file__).resolve().parent / "playbooks").resolve()
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class _Strict(YamlModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, defer_build=True, allow_inf_nan=False
    )  # allow_inf_nan: a `.nan` min_accept would switch the accept-length check off


class MTPSpec(_Strict):
    algorithm: str = "EAGLE"
    num_steps: int | None = Field(None, ge=1)
    eagle_topk: int | None = Field(None, ge=1)
    num_draft_tokens: int | None = Field(None, ge=1)
    draft_model_path: str | None = None


class MultiNodeSpec(_Strict):
    """``multinode:`` in a playbook: the model is served by ``nodes`` hosts at once, one rank each (an
    inventory group, issue 26). orch adds ``--nnodes``, ``--node-rank`` and ``--dist-init-addr
    RANK0:dist_init_port`` to every rank (SGLang's multi-node launch, reference sglang.md §6.4); SGLang
    also takes the 6 ports above ``dist_init_port`` on rank 0. ``interface_env``: the environment variables
    that get the group's ``network_interface`` in every rank's launch environment (never its argv)."""

    nodes: int = Field(ge=2, le=64)
    dist_init_port: int = Field(20000, ge=1, le=65535)
    interface_env: list[str] = Field(default_factory=lambda: ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])

    @field_validator("interface_env")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not is_env_name(name) or looks_secret(name):
                raise ValueError(f"{name!r} is not the name of an environment variable for a network interface")
        return value


class TuningSpec(_Strict):
    shapes: list[Shape] = Field(default_factory=list)
    batch_sizes: BatchSizes = Field(default_factory=lambda: list(DEFAULT_BATCH_SIZES), min_length=1)
    fleet: bool = False  # spread units over every GPU of hosts with the same GPU and SGLang commit
    # What the schedule counts (estimates for one GPU; only their ratio changes the plan): the seconds one
    # tuner call spends before its first unit (imports, CUDA init, its spawned worker's imports), and
    # the seconds one (shape, batch size) unit takes. A GPU's job runs each of its shapes in one call.
    tuner_startup_s: float = Field(20.0, ge=0)
    tuner_unit_s: float = Field(60.0, gt=0)
    # How long a tuning job may go silent once the tuner run it is in has every batch size done before orch calls
    # it stuck (a tuner hung in its pool's teardown: reference §1.1) and stops it; its finished runs are kept.
    stuck_after_s: float = Field(STUCK_AFTER_S, gt=0)


MAX_PROMPTS, MAX_IN_FLIGHT, MAX_TOKENS = 1_000_000, 100_000, 10_000_000
"""Bounds of a benchmark's requests, of those in flight and of a request's input or output tokens (a typo of a
few digits, not a load ever run: SGLang's benchmark died of a MemoryError making a prompt of 10^12 tokens)."""


class BenchSpec(_Strict):
    input_len: int = Field(1024, gt=0, le=MAX_TOKENS)
    output_len: int = Field(256, gt=0, le=MAX_TOKENS)
    num_prompts: int = Field(64, gt=0, le=MAX_PROMPTS)
    max_concurrency: int = Field(16, gt=0, le=MAX_IN_FLIGHT)
    request_rate: float | None = None
    # SGLang's default 0.0 draws each request's lengths from [1, len]; 1.0 keeps them fixed at len.
    random_range_ratio: float = Field(1.0, ge=0.0, le=1.0)
    # random: prompts of real text, sampled from dataset_path (a ShareGPT-format JSON on the host; relative:
    # under orch's workdir; `orch bench --dataset FILE` copies one there). random-ids: random token ids,
    # no file, but MTP accepts fewer of them than of real text: its accept lengths are not representative.
    dataset_name: Literal["random", "random-ids"] = "random"
    dataset_path: str = Field("datasets/sharegpt.json", min_length=1)


# -- step options: the same models the single commands build from their flags ------------------
# Each field is written here only: its flag (`--batch-sizes`), default, bounds and help (`description`)
# come from it (``cli.common.options_from``), so a command and an ``orch run`` step never disagree.


class PullOptions(_Strict):
    install: bool = Field(False, description="Then run `pip install -e python` with the host's python.")


class TuneOptions(_Strict):
    shapes: str = Field(  # default | auto | logged | "N=1024,K=4096;N=4096,K=2048"
        "default",
        description="default: the recipe's shapes; auto: from the model's config.json (rules for "
        "DeepseekV3ForCausalLM and DeepseekV4ForCausalLM: orchestrator/facts/tuner.py SHAPE_RULES); logged: exactly "
        "the shapes the host's last --fp8-gemm-backend triton server logged as 'Config file not found' for its GPU; "
        "or 'N=1024,K=4096;N=4096,K=2048'.",
    )
    batch_sizes: BatchSizes | None = Field(  # an empty list would install empty configs
        None, min_length=1, description="Batch sizes to tune, 1..65536 (default: the recipe's, 18 sizes 1..4096)."
    )
    fleet: bool | None = Field(  # None: as the recipe says
        None, description="Spread the work over every GPU of hosts with the same GPU and SGLang commit."
    )
    force: bool = Field(False, description="Tune again shapes already installed for this device and commit.")
    allow_busy_gpus: bool = Field(False, description="Start even when other processes hold the GPUs.")
    stop_server: bool = Field(False, description="First stop the server orch launched on the host.")
    wait: bool = Field(  # `orch run` always waits (its next step needs the configs installed)
        False, description="Show live progress until the jobs end, then install the configs."
    )
    poll: float = Field(1.0, ge=0.1, le=60, description="Seconds between polls.")

    @field_validator("shapes")
    @classmethod
    def _shape_list(cls, value: str) -> str:
        """A list that parses, checked when a playbook is read: its error names the playbook's step and key,
        not ``--shapes``, which the user did not type (the command line's is ``cli.tune.check_shapes``)."""
        if value not in ("default", "auto", "logged"):
            _shapes(value)
        return value


class ServeOptions(_Strict):
    mtp: bool = Field(True, description="Serve with the recipe's MTP speculative flags.")
    wait_tuning: bool = Field(True, description="Wait for running FP8 tuning jobs first.")
    rollback: bool = Field(False, description="If the new server fails to start, relaunch the last known-good one.")
    min_accept: float | None = Field(None, ge=0, description="Minimum accept length (default: the recipe's).")
    health_timeout: float | None = Field(  # None: the recipe's health_timeout
        None,
        ge=1,
        description="Seconds to wait for /health (default: the recipe's health_timeout; DeepSeek-V4-Flash: 3600).",
    )
    drain_timeout: float = Field(120, ge=1, description="Seconds the old server may drain before SIGKILL.")
    fp8_gemm_backend: str | None = Field(  # None: the recipe's (auto when no tuned config is installed)
        None,
        description="Launch with this FP8 GEMM backend (e.g. triton, auto). Default: the recipe's, or auto when no "
        "tuned config is installed for the GPU.",
    )
    use_installed_configs: bool = Field(
        False, description="Serve with the tuned FP8 configs installed now, even after a failed tuning."
    )
    force: bool = Field(False, description="Relaunch even when the server already runs as asked.")

    @field_validator("fp8_gemm_backend")
    @classmethod
    def _backend_name(cls, value: str | None) -> str | None:
        """A backend's name: an empty one launched without the flag (the recipe's backend dropped, the healthy
        server replaced by one on SGLang's default) and then asked the server for ''."""
        if value is not None and (not value or value != value.strip() or " " in value):
            raise ValueError(f"{value!r} is no backend name (e.g. triton, auto); leave the option out for the recipe's")
        return value


def _label(value: str | None) -> str | None:
    """A run's label: one line of at most 100 printable characters (it heads tables, report rows and
    metric labels)."""
    if value is not None and (not value.strip() or len(value) > 100 or any(c < " " or c == "\x7f" for c in value)):
        raise ValueError(f"{value[:100]!r} is no label: write one line of 1 to 100 printable characters")
    return value


class BenchOptions(_Strict):
    label: str | None = Field(
        None,
        description="Name of this configuration in the comparison. Default: '<commit> [<serving profile>] mtp|no-mtp'.",
    )
    dataset: str | None = Field(  # a file on the controller, copied to each host's bench.dataset_path first
        None,
        description="A ShareGPT-format JSON on this machine: copied to each host's bench.dataset_path first "
        "(checked by sha256, copied only when the host's differs).",
    )
    baseline: str | None = Field(
        None,
        description="Compare with the latest run with this label. Default: the first run of the same model and nodes.",
    )
    input_len: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Random prompt length in tokens (default: the playbook's)."
    )
    output_len: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="Output tokens per request (default: the playbook's)."
    )
    num_prompts: int | None = Field(
        None, ge=1, le=MAX_PROMPTS, description="Requests to send (default: the playbook's)."
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=MAX_IN_FLIGHT, description="Requests in flight at most (default: the playbook's)."
    )

    _labels = field_validator("label", "baseline")(_label)


class ProfileOptions(_Strict):
    """``orch profile``: batches to profile per stage, the run's label, seconds the load and traces may take."""

    steps: int = Field(5, ge=1, le=200, description="Batches to profile in each stage (prefill, decode).")
    label: str | None = Field(
        None, description="Name of this profile (before/after). Default: '<commit> [<serving profile>] mtp|no-mtp'."
    )
    timeout: float = Field(600.0, ge=10, description="Seconds the load and the traces may take on each host.")

    _label = field_validator("label")(_label)


class SweepOptions(_Strict):
    """``orch sweep``: the serving profiles to serve in turn (None: every profile of the playbook), the
    concurrencies to benchmark each at, and ``then_serve``: the concurrency whose best profile is served
    after the sweep (``--then-serve BEST@C``; None: the last profile swept keeps serving)."""

    profiles: list[str] | None = Field(
        None, min_length=1, description="Serving profiles to compare, in order. Default: the playbook's."
    )
    concurrency: list[int] = Field(
        default_factory=lambda: [1, 8, 32, 128], min_length=1, description="Concurrent requests of each benchmark run."
    )
    then_serve: int | None = Field(
        None, description="After the sweep, serve the profile that won at concurrency C (one of --concurrency)."
    )
    bench_timeout: float = Field(3600.0, gt=0, description="Seconds one benchmark run may take.")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(c <= 0 or c > MAX_IN_FLIGHT for c in value):
            raise ValueError(f"concurrencies are whole numbers from 1 to {MAX_IN_FLIGHT:,} (e.g. [1, 8, 32, 128])")
        return sorted(set(value))

    @model_validator(mode="after")
    def _served_level(self) -> SweepOptions:
        if self.then_serve is not None and self.then_serve not in self.concurrency:
            listed = ", ".join(str(c) for c in self.concurrency)
            raise ValueError(f"then_serve {self.then_serve} is not one of the sweep's concurrencies ({listed})")
        return self


STEP_OPTIONS: dict[str, type[_Strict]] = {
    "pull": PullOptions,
    "tune-fp8": TuneOptions,
    "serve": ServeOptions,
    "bench": BenchOptions,
    "profile": ProfileOptions,
    "sweep": SweepOptions,
}


class Step(_Strict):
    name: Literal["pull", "tune-fp8", "serve", "bench", "profile", "sweep"]
    options: PullOptions | TuneOptions | ServeOptions | BenchOptions | ProfileOptions | SweepOptions

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, value: Any) -> Any:
        """``pull`` or ``{serve: {mtp: true}}`` in YAML → ``Step(name, options)``."""
        if isinstance(value, str):
            value = {value: {}}
        if isinstance(value, dict) and len(value) != 1 and not {"name", "options"} & set(value):
            # else pydantic names the fields the YAML form maps to ("steps.3.name: Field required")
            names = ", ".join(str(k) for k in value)
            raise ValueError(
                "a step is one mapping of one step name to its options; "
                + (f"this one has {len(value)} ({names})" if value else "this one is empty")
            )
        if isinstance(value, dict) and len(value) == 1 and "name" not in value:
            ((name, opts),) = value.items()
            if name not in STEP_OPTIONS:
                close = difflib.get_close_matches(str(name), STEP_OPTIONS, n=1)
                typo = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown step {name!r}{typo}; steps are: {', '.join(STEP_OPTIONS)}")
            return {"name": name, "options": STEP_OPTIONS[name].model_validate(opts or {})}
        return value


SIZE_FLAGS = frozenset({
    "tp", "tp-size", "tensor-parallel-size", "dp", "dp-size", "data-parallel-size", "attn-dp-size",
    "pp-size", "pipeline-parallel-size", "ep", "ep-size", "expert-parallel-size", "base-gpu-id",
})  # fmt: skip
"""The server flags orch reads as whole numbers: the GPUs a server spans and how they are split."""


def _check_flags(value: dict[str, Any]) -> dict[str, Any]:
    """Server argument names as SGLang writes them, none orch sets itself, no secret among the values, a
    whole number for each of ``SIZE_FLAGS`` (or ``false``: a profile dropping the base recipe's)."""
    for name in value:
        if not _FLAG.match(name):
            raise ValueError(f"{name!r} is not a flag name (write 'mem-fraction-static', without '--')")
        size = value[name]
        if name in SIZE_FLAGS and size is not False and not (isinstance(size, int) or str(size).isdigit()):
            raise ValueError(f"{name!r} is {size!r}: write a whole number (orch counts the server's GPUs from it)")
        own = orch_flag(name)
        if own:
            raise ValueError(
                f"{name!r} is {own}, which orch sets (from the inventory's model_path and server_port, "
                "the recipe's mtp and fp8_gemm_backend blocks, or its multinode block and the group's ranks)"
            )
        secret = find_secret({name: str(value[name])})
        if secret:  # the launch command goes into the state file, the job directory and `ps` on the host
            raise ValueError(f"{name!r} looks like a secret ({secret!r}): pass it in the host's env instead")
    return value


PROFILE_NAME = re.compile(r"[^\s,]{1,40}")
"""A serving profile's name: one word (a sweep's run label is split on spaces), no comma (``--profiles A,B``)."""


class ServingProfile(_Strict):
    """A named way to serve the recipe's model (``profiles:`` in a playbook; ``orch serve --profile``).

    ``server_args`` are laid over the recipe's (``false`` drops a base flag); ``mtp`` replaces the
    recipe's MTP block when the key is written, and ``mtp: null`` serves without MTP. ``concurrency``:
    the concurrent requests the profile is meant for (upstream's recipes: low latency up to 32,
    balanced up to 128), for the reader and for ``orch sweep``'s bands.
    """

    description: str = ""
    concurrency: int | None = Field(None, gt=0)
    server_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    mtp: MTPSpec | None = None
    # when written: replaces the recipe's (fewer draft tokens accept fewer); bounded as `serve --min-accept` is
    min_accept_length: float | None = Field(None, ge=0)

    @field_validator("server_args")
    @classmethod
    def _flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_flags(value)


class Recipe(_Strict):
    model: str
    architecture: str
    source_tests: list[str] = Field(default_factory=list)  # upstream tests the flags come from
    server_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    mtp: MTPSpec | None = None
    fp8_gemm_backend: str | None = None  # "triton" to read tuned configs on sm_120
    min_accept_length: float | None = Field(None, ge=0)  # as `serve --min-accept`: an accept length is never < 0
    health_timeout: float = Field(DEFAULT_HEALTH_TIMEOUT, gt=0)  # seconds serve waits for /health
    tuning: TuningSpec = TuningSpec()
    bench: BenchSpec = BenchSpec()
    steps: list[Step] = Field(default_factory=list)
    profiles: dict[str, ServingProfile] = Field(default_factory=dict)
    multinode: MultiNodeSpec | None = None  # None: one host serves the model
    path: Path | None = Field(None, exclude=True)
    digest: str | None = Field(None, exclude=True)  # sha256 of what the playbook says (``load_recipe``), 12 digits
    profile: str | None = Field(None, exclude=True)  # the serving profile this recipe is served as (``with_profile``)

    @field_validator("server_args")
    @classmethod
    def _flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_flags(value)

    @field_validator("steps")
    @classmethod
    def _steps_once(cls, value: list[Step]) -> list[Step]:
        names = [step.name for step in value]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:
            raise ValueError(
                f"step {twice!r} is listed twice: a campaign runs each step once (orch run records a done step by "
                "its name, so the second would be skipped as done); write it once, or make a second playbook"
            )
        return value

    @field_validator("profiles")
    @classmethod
    def _profile_names(cls, value: dict[str, ServingProfile]) -> dict[str, ServingProfile]:
        for name in value:
            if not PROFILE_NAME.fullmatch(name):
                raise ValueError(
                    f"profile name {name[:60]!r}: one word of 1 to 40 characters, no comma (it names the profile in "
                    "--profile, --profiles lists and the sweep's benchmark labels)"
                )
        return value

    @property
    def campaign(self) -> str:
        """What ``orch run`` records its steps under (``StepProgress.playbook``): the playbook's absolute path and
        the hash of what it says (its YAML as read: a comment, the layout or the order of keys do not count).
        The same file named another way is the same campaign; another file at that path, or this one asking
        something else, is another, whose steps run again (a run of it said `already done` of the last's)."""
        where = str(self.path.resolve()) if self.path is not None else self.model
        return f"{where} (sha256 {self.digest})" if self.digest else where

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def with_profile(self, name: str) -> Recipe:
        """The recipe served as profile ``name``: its server arguments over the base ones, its MTP block
        when it writes one (``mtp: null``: none), its minimum accept length when it writes one.
        ``ConfigError`` naming the known profiles otherwise."""
        chosen = self.profiles.get(name)
        if chosen is None:
            known = ", ".join(self.profiles) or "none"
            raise ConfigError(
                f"{self.path or self.model}: no serving profile {name!r} (profiles: {known})",
                hint="add it under 'profiles:' in the playbook, or pick one of those",
            )
        given = chosen.model_fields_set
        update = {
            "server_args": {**self.server_args, **chosen.server_args},
            "mtp": chosen.mtp if "mtp" in given else self.mtp,
            "min_accept_length": chosen.min_accept_length if "min_accept_length" in given else self.min_accept_length,
            "profile": name,
        }
        return self.model_copy(update=update)


# The server flags orch sets itself, and their SGLang aliases (reference/sglang.md §2.1).
ORCH_FLAGS = ("model-path", "port", "fp8-gemm-backend", "speculative-", "nnodes", "node-rank", "dist-init-addr")
FLAG_ALIASES = {"model": "model-path", "speculative-draft-model": "speculative-draft-model-path"}


def orch_flag(name: str) -> str | None:
    """How recipe flag ``name`` names a flag orch sets: ``--port`` itself, ``the alias --model of
    --model-path``, ``a prefix of --port`` (SGLang's parser takes a unique prefix as the flag), or None.

    >>> orch_flag("model"), orch_flag("por"), orch_flag("tp-size")
    ('the alias --model of --model-path', 'a prefix of --port', None)
    """
    if name in FLAG_ALIASES:
        return f"the alias --{name} of --{FLAG_ALIASES[name]}"
    for flag in ORCH_FLAGS:
        if name == flag or (flag.endswith("-") and name.startswith(flag)):
            return f"--{name}"
        if flag.startswith(name):
            return f"a prefix of --{flag.rstrip('-')}" + ("-*" if flag.endswith("-") else "")
    return None


def parse_shapes(text: str) -> list[Shape]:
    """``"N=1024,K=4096;N=4096,K=2048"`` (``--shapes``) → shapes; a malformed part raises ``ConfigError``
    naming the flag and the part. A playbook step's ``shapes`` is checked when the playbook is read
    (``TuneOptions``), so an error from here is the command line's."""
    try:
        return _shapes(text)
    except ValueError as exc:
        raise ConfigError(f"--shapes: {exc}") from None


def _shapes(text: str) -> list[Shape]:
    """``parse_shapes`` without the flag: a ``ValueError`` naming the malformed part."""
    shapes = []
    for part in [p.strip() for p in text.split(";")]:
        m = re.fullmatch(r"N\s*=\s*(\d+)\s*,\s*K\s*=\s*(\d+)", part, flags=re.IGNORECASE)
        if not m or int(m[1]) == 0 or int(m[2]) == 0:
            raise ValueError(f"{part!r} is not of the form N=1024,K=4096 (shapes separated by ';')")
        shapes.append(Shape.model_validate({"N": int(m[1]), "K": int(m[2]), "source": "command line"}))
    return shapes


def find_recipe(name_or_path: str, search_dirs: list[Path]) -> Path:
    """The playbook file ``name_or_path`` names: an existing path that ends in ``.yaml``/``.yml`` or has a
    ``/`` (``./pb``: a path, whatever its name ends in), else ``NAME.yaml``/``NAME.yml`` in ``search_dirs``
    then the shipped playbooks. ``ConfigError`` naming the known playbooks otherwise (for a bare name that
    is a file here, how to give it as a path; for a path, that its file does not exist). An existing path
    is returned whatever it is: a directory is refused by ``load_recipe`` as one (``read_text``), not said
    to be no playbook."""
    candidate = Path(name_or_path)
    a_path = candidate.suffix in (".yaml", ".yml") or "/" in name_or_path
    if a_path and candidate.exists():
        return candidate
    for d in [*search_dirs, PACKAGED_PLAYBOOKS]:
        for suffix in (".yaml", ".yml"):
            if (d / f"{name_or_path}{suffix}").exists():
                return d / f"{name_or_path}{suffix}"
    known = known_recipes(search_dirs)
    if candidate.is_file():  # a bare name is a playbook's name: a file of that name is read as ./NAME only
        raise ConfigError(
            f"no playbook {name_or_path!r}; known: {', '.join(known) or 'none'} (a file {name_or_path!r} is here, "
            "but a name without '/' or .yaml is looked up among the playbooks)",
            hint=f"give the file as a path: ./{name_or_path}",
        )
    if a_path:  # meant as a file: the known names are the way out, not what is wrong
        raise ConfigError(
            f"no playbook file {name_or_path!r}: {candidate.absolute()} does not exist",
            hint=f"check the path, or give a known playbook by name: {', '.join(known) or 'none'}",
        )
    raise ConfigError(
        f"no playbook {name_or_path!r}; known: {', '.join(known) or 'none'}",
        hint="give one of the known names, or a path to a YAML file",
    )


def known_recipes(search_dirs: list[Path]) -> list[str]:
    """The playbook names ``find_recipe`` finds: in ``search_dirs`` and the shipped playbooks, sorted."""
    dirs = [d for d in [*search_dirs, PACKAGED_PLAYBOOKS] if d.is_dir()]
    return sorted({p.stem for d in dirs for suffix in ("yaml", "yml") for p in d.glob(f"*.{suffix}")})


def load_recipe(path: Path) -> Recipe:
    try:
        text = read_text(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read playbook: {exc.strerror or exc}") from None
    raw = load_yaml(path, text)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a playbook is a mapping (model, architecture, server_args, mtp, ...)")
    found = control_character(raw)
    if found:  # the values reach the host's command line and files, where a newline would cut them
        raise ConfigError(
            f"{path}: key {found[0]!r}: holds {found[1]}; orch passes playbook values to the host literally",
            hint="remove the character (a double-quoted YAML string turns \\n, \\r, \\0 into one)",
        )
    try:
        said = json.dumps(raw, sort_keys=True, default=str)  # what it asks, not how it is written
        digest = hashlib.sha256(said.encode()).hexdigest()[:12]
        return Recipe.model_validate({**raw, "path": path, "digest": digest})
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(path, exc, raw))) from None


SCALAR_TYPES = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}
"""The branches of a server argument's union (``str | int | float | bool``), as pydantic names them in an
error's ``loc`` (``server_args.tp-size.str``), and how the user would say each."""


def _describe(path: Path, exc: ValidationError, raw: dict[str, Any]) -> list[str]:
    """One line per error, as the user wrote the file: a key path of the YAML's keys (never a union branch
    pydantic tried: a server argument that is none of its types is one line, not one per type)."""
    lines: list[str] = []
    for err in exc.errors():
        loc = err["loc"]
        if len(loc) > 1 and loc[-1] in SCALAR_TYPES and _is_scalar_union(loc[:-1]):
            line = f"{path}: key {'.'.join(str(p) for p in loc[:-1])!r}: must be a string, number or boolean"
            lines += [line] if line not in lines else []
            continue
        key = ".".join(str(p) for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            step = _step_options(raw, loc)  # a step's options: its model is chosen by the step's name
            close = did_you_mean(str(loc[-1]), step, ()) if step else did_you_mean(str(loc[-1]), Recipe, loc[:-1])
            msg += " (unknown key" + (f": did you mean {close!r}?)" if close else ")")
        lines.append(f"{path}: key {key!r}: {msg}")
    return lines


def _is_scalar_union(loc: tuple[Any, ...]) -> bool:
    """Whether ``loc`` is a server argument's (``server_args.X``, ``profiles.P.server_args.X``): a value of the
    union of ``SCALAR_TYPES``."""
    return len(loc) >= 2 and loc[-2] == "server_args"


def _step_options(raw: dict[str, Any], loc: tuple[Any, ...]) -> type[_Strict] | None:
    """The options model of the step an error's ``loc`` (``steps.0.concurency``) is in, else None."""
    steps = raw.get("steps")
    if len(loc) != 3 or loc[0] != "steps" or not isinstance(loc[1], int) or not isinstance(steps, list):
        return None
    step = steps[loc[1]] if loc[1] < len(steps) else None
    name = next(iter(step), None) if isinstance(step, dict) and len(step) == 1 else step
    return STEP_OPTIONS.get(name) if isinstance(name, str) else None
