"""Preparing a host for tuning: discover on the host, resolve the shapes, skip installed ones, check GPUs.

Nothing is hard-coded that the host can tell: the tuner's flags come from its ``--help``, the runtime
config directory from importing SGLang's ``fp8_kernel`` with the host's python, the GPU name from
nvidia-smi, Triton's version if it imports, the SGLang commit from git. A host already running a plan
is attached to instead (``Prepared.attach``), unless none of that plan's jobs runs any more and some
were lost (a reboot killed them): then it is failed first, as ``orch wait`` would (``settle_lost``); a
plan that does not tune a shape asked is refused, not attached to (``attach.refuse_other_shapes``).
After a plan that failed (its jobs lost to a reboot, say), the result files its finished runs wrote
are validated and kept (``kept_results``): the next plan tunes only the rest. What is installed is read
from the host too: a config orch marked there (``install.MARKS``) that this state does not record (another
controller installed it, or the state directory was lost) is adopted, not tuned again (``adopt_marks``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pydantic import BaseModel

from orchestrator import jobs
from orchestrator import server_job as srv
from orchestrator.errors import ConfigError, HostError, RefusedError, RemoteCommandError, UnreachableError
from orchestrator.facts import git, probe
from orchestrator.facts import gpus as smi
from orchestrator.facts import server as server_facts
from orchestrator.facts import tuner as tf
from orchestrator.inventory import Host
from orchestrator.recipe import Recipe, ServeOptions, Shape, TuneOptions, parse_shapes
from orchestrator.session import HostSession
from orchestrator.state import HostState, ServerRecord
from orchestrator.transport.base import CommandResult, Runner, check_result
from orchestrator.tuning.attach import left_out, refuse_other_shapes
from orchestrator.tuning.install import MARKS, complete_group, describe_failure
from orchestrator.tuning.logged import logged_shapes
from orchestrator.tuning.member import (
    ENDED_FILE,
    PLAN_FILE,
    edit_record,
    plan_of,
    record_of,
    record_plan,
    records,
    running_plan,
)
from orchestrator.tuning.progress import HostPoll, job_views, poll_group, poll_host
from orchestrator.tuning_record import (
    STUCK_AFTER_S,
    AssignmentRecord,
    InstalledRecord,
    InstallMark,
    KeptRecord,
    PlanRecord,
    RunRecord,
    TuningRecord,
)

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


@dataclass
class HostFacts:
    """What orch found on a host before tuning it."""

    host: Host
    tuner: str  # absolute path of the tuner script
    flags: frozenset[str]
    config_dir: str
    triton: str | None
    device: str  # nvidia-smi's name, spaces and all
    commit: str
    gpus: list[smi.Gpu]
    holders: list[smi.Holder] = field(default_factory=list)  # every GPU's, from discovery (no job ties)
    marks: list[InstallMark] = field(default_factory=list)  # the configs orch marked installed on the host
    open_plans: list[PlanRecord] = field(default_factory=list)  # plans orch started there that have not ended


DISCOVER_TIMEOUT = 300 + 300 + 2 * smi.CLIENT_TIMEOUT + 60  # the --help, the import, nvidia-smi twice, git


class FileReader(Protocol):
    def read_bytes(self, path: str) -> bytes: ...


@dataclass
class ReadAhead:
    """Files read in the discovery round trip (None: could not be read); any other path is read from
    the host when first asked, and kept (``installed_here`` asks no more of a file ``adopt_marks`` read)."""

    runner: Runner
    files: dict[str, bytes | None] = field(default_factory=dict)

    def read_bytes(self, path: str) -> bytes:
        if path not in self.files:
            try:
                self.files[path] = self.runner.read_bytes(path)
            except OSError:
                self.files[path] = None
                raise
        data = self.files[path]
        if data is None:
            raise OSError(f"{self.runner.host}: cannot read {path}")
        return data


def discover(session: HostSession, paths: Sequence[str] = ()) -> tuple[HostFacts, ReadAhead]:
    """Read the tuner, the runtime config directory, the GPUs, Triton and the SGLang commit, and the
    files at ``paths`` (the configs a plan may skip or keep), in one remote command.

    The checkout it reads is the session's ``git`` fact (same command, same parser): it is cached for
    what the invocation reads next (``orch run``'s serve step). Its GPU holders are not the session's
    ``gpus`` fact, which ties each holder to its orch job (one more round trip): the tuning refusal
    needs only who holds a GPU."""
    host, runner = session.host, session.runner
    argvs = dict(discover_sections(host, paths))
    sections = probe.parse(runner.run(probe.probe_argv(list(argvs.items())), timeout=DISCOVER_TIMEOUT).stdout)

    def answer(name: str) -> CommandResult:  # a section as a command's result: stdout and stderr are one text
        if name not in sections:
            raise RemoteCommandError(
                f"{host.name}: the discovery command ended before `{name}` answered", exit_status=-1
            )
        section = sections[name]
        return CommandResult(tuple(argvs[name]), section.exit_status, section.output, section.output)

    script, flags = tuner_of(host, answer("tuner"))
    runtime = runtime_of(host, answer("runtime"))
    devices, holders = holders_of(host, answer("gpus"), answer("apps"))
    if not devices:
        raise RefusedError(f"{host.name}: nvidia-smi lists no GPU")
    checkout = session.know("git", git.parse_info(check_result(host.name, answer("git")).stdout))
    config_dir = runtime.config_dir or ""
    facts = HostFacts(
        host, script, flags, config_dir, runtime.triton, devices[0].name, checkout.commit, devices, holders,
        marks_in(host, sections.get("marks")),
        _documents(PlanRecord, host, sections.get("open_plans"), "tuning plan file"),
    )  # fmt: skip
    return facts, ReadAhead(runner, {path: _file(sections.get(f"file{i}")) for i, path in enumerate(paths)})


def discover_sections(host: Host, paths: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """The commands of ``discover``'s one remote command (``facts.probe``): the tuner's first, so
    nothing it prints can stand in for a later section; files travel base64-encoded."""
    sections = [
        ("tuner", tf.find_tuner_argv(host.python, host.sglang_dir)),
        ("runtime", tf.discover_argv(host.python)),
        ("gpus", smi.query_gpus_argv()),
        ("apps", smi.query_apps_argv()),
        ("git", git.info_argv(host.sglang_dir, host.upstream)),
        ("marks", marks_argv(host)),
        ("open_plans", open_plans_argv(host)),
    ]
    return sections + [(f"file{i}", ["base64", "-w0", "--", path]) for i, path in enumerate(paths)]


_READ_DOCS = r"""
[ -d "$1" ] && [ ! -L "$1" ] || exit 0
for f in "$1"/$2; do
  d=${f%/*}
  [ -f "$f" ] && [ ! -L "$f" ] && [ ! -L "$d" ] || continue
  [ -n "$3" ] && [ -e "$d/$3" ] && continue
  base64 -w0 -- "$f"; echo
done
exit 0
"""


def _read_docs_argv(directory: str, pattern: str, unless: str = "") -> list[str]:
    """Each file under ``directory`` that ``pattern`` names (a glob of orch's own names), base64-encoded, one per
    line, never through a symlink; with ``unless``, not one whose directory holds a file of that name."""
    return ["sh", "-c", _READ_DOCS, "orch-docs", directory, pattern, unless]


def _documents(model: type[M], host: Host, section: probe.Section | None, what: str) -> list[M]:
    """The documents ``_read_docs_argv`` printed, as ``model``; one that does not read as one is left out (said
    with -v)."""
    found = []
    for line in (section.output if section is not None and section.ok else "").split():
        try:
            found.append(model.model_validate_json(base64.b64decode(line, validate=True)))
        except ValueError as exc:  # binascii.Error and pydantic's ValidationError are ValueErrors
            log.info("%s: an unreadable %s in %s: %s", host.name, what, host.workdir, str(exc).splitlines()[0])
    return found


def adopt_host_plan(
    session: HostSession, record: TuningRecord, plans: Sequence[PlanRecord], look: bool
) -> PlanRecord | None:
    """The newest plan orch started on this host that has not ended (``plans``, read from the host) and that
    this state does not know, when one of its jobs ran here: recorded as the running plan of its group's hosts
    (their jobs are then found by purpose and staging directory, never started again: ``start.resume_starts``)
    and said, unless ``look``. Another controller started it, or the state directory was lost: waiting for it
    installs its configs; a new plan would tune them again once its GPUs are free. A host of the group whose
    own prepare comes after (``--fleet``: in parallel) finds the plan recorded for it and attaches to it too,
    never adopting marks or planning again beside it."""
    host = session.host
    for plan in sorted(plans, key=lambda p: p.created_at, reverse=True):
        if host.name not in plan.hosts or plan.id == record.plan_id or not _ran_here(session, plan):
            continue
        if look:
            return plan
        with session.store.update() as state:
            if plan.id in state.tuning_plans:  # recorded since (this run, for another host of the group; or another
                mine = record_of(state.hosts.get(host.name))  # orch of this state): attached to while it runs here
                return plan if (mine.plan_id, mine.state) == (plan.id, "running") else None
            reason = f"adopted tuning plan {plan.id}, found running on the host (this state did not record it)"
            record_plan(state, plan.group, plan, reason)
        session.say(
            f"tuning plan {plan.id} runs on this host and this state did not record it (another controller, or a "
            "lost state directory): adopted; its jobs are waited for, not started again"
        )
        return plan
    return None


def _ran_here(session: HostSession, plan: PlanRecord) -> bool:
    """Whether a job of ``plan`` was started on this host: one of its purposes' jobs writes its staging directory."""
    mine = {a.purpose: a.staging.encode() for a in plan.on(session.host.name)}
    for info in session.jobs():
        if info.purpose in mine and info.state != "lost":
            try:
                if mine[info.purpose] in session.job_argv(info.id):
                    return True
            except OSError:
                continue
    return False


def open_plans_argv(host: Host) -> list[str]:
    """The command printing the plans orch started on ``host`` that have not ended, one base64 document a line."""
    return _read_docs_argv(f"{host.workdir.rstrip('/')}/tune", f"*/{PLAN_FILE}", unless=ENDED_FILE)


def read_open_plans(session: HostSession) -> list[PlanRecord]:
    """The plans orch started on the host that have not ended (as ``discover`` reads them, in a command of their
    own)."""
    result = session.runner.run(open_plans_argv(session.host), timeout=60)
    return _documents(PlanRecord, session.host, probe.Section(result.exit_status, result.stdout), "tuning plan file")


def marks_argv(host: Host) -> list[str]:
    """The command printing the install marks orch left on ``host`` (``MARKS``), one base64 document a line."""
    return _read_docs_argv(f"{host.workdir.rstrip('/')}/{MARKS}", "*.json")


def marks_in(host: Host, section: probe.Section | None) -> list[InstallMark]:
    """The install marks ``marks_argv`` printed (its section of a probe); one that does not read is left out."""
    return _documents(InstallMark, host, section, "install mark")


def read_marks(session: HostSession) -> list[InstallMark]:
    """The configs orch marked installed on the host (as ``discover`` reads them, in a command of their own)."""
    result = session.runner.run(marks_argv(session.host), timeout=60)
    return marks_in(session.host, probe.Section(result.exit_status, result.stdout))


def adopt_marks(
    session: HostSession, record: TuningRecord, marks: Sequence[InstallMark], *, device: str, commit: str | None,
    files: FileReader, look: bool,
) -> TuningRecord:  # fmt: skip
    """``record`` with the configs orch marked installed on the host (``marks``) for ``device`` and the checkout's
    ``commit`` (None: any commit, for ``orch serve`` to say which one each was tuned at) that it does not record
    (or records an older install of), each trusted only while its file holds
    the bytes orch wrote; said and recorded unless ``look``. The state is a record, not the authority: a config
    another controller installed, or one a lost state directory forgot, is not tuned again (its server
    stopped), nor called another's by ``orch serve``."""
    found: dict[str, InstalledRecord] = {}
    for mark in marks:
        done, have = mark.installed, record.installed.get(mark.key)
        if done.device != device or (commit is not None and done.commit != commit):
            continue
        if have is not None and have.installed_at >= done.installed_at:
            continue
        try:
            data = files.read_bytes(done.path)
        except OSError:
            continue
        if hashlib.sha256(data).hexdigest() == mark.sha256:
            found[mark.key] = done
    if found and not look:
        plans = ", ".join(sorted({done.plan_id or "?" for done in found.values()}))
        session.say(
            f"tuned configs orch installed on this host that this state did not record: {', '.join(found)} "
            f"(plan {plans}; marked in {session.host.workdir.rstrip('/')}/{MARKS}): recorded, not tuned again"
        )
        edit_record(session.store, session.host.name, lambda _hs, r: r.installed.update(found))
    return record.model_copy(update={"installed": {**record.installed, **found}}) if found else record


def failure_overtaken(session: HostSession, look: bool = False) -> dict[str, InstalledRecord] | None:
    """The configs that make the tuning this state records as failed on the host done all the same: orch's marks
    there (``MARKS``) show every shape of the failed plan installed since that plan was made, for its GPU and
    SGLang commit (another controller's plan, started beside it or after), each file holding what orch wrote
    (``adopt_marks``). None when the host shows no such thing. The state is a record, not the authority: a
    failure it alone remembers does not hold back ``orch serve`` from what the host has. Unless ``look``, the
    configs are recorded and the tuning ``installed`` (said): ``orch status`` shows it so too."""
    state = session.store.read([session.name])
    record = record_of(state.hosts.get(session.name))
    plan = plan_of(state, record)
    if record.state != "failed" or plan is None:
        return None
    since = overtaking(plan, read_marks(session))
    marked = adopt_marks(session, TuningRecord(), since, device=plan.device, commit=plan.commit,
                         files=session.runner, look=True).installed  # fmt: skip
    if not {s.key for s in plan.shapes} <= set(marked):
        return None
    if not look:
        by = ", ".join(sorted({done.plan_id or "?" for done in marked.values()}))
        edit_record(session.store, session.name, lambda hs, r: _overtaken(hs, r, plan.id, marked, by))
        session.say(
            f"tuning plan {plan.id} failed in this state ({record.reason}), but its shapes were installed on the host "
            f"since by orch (plan {by}; marked in {session.host.workdir.rstrip('/')}/{MARKS}): recorded installed"
        )
    return marked


def installed_by_another(members: Sequence[HostSession], plan: PlanRecord) -> dict[str, dict[str, InstalledRecord]]:
    """Each member's configs of ``plan``, when orch's marks on every member (``MARKS``) show every shape of this very
    plan installed there, each file holding what orch wrote (``adopt_marks``): another orch (a second controller)
    adopted the plan and installed it. Empty when the hosts do not show that. One command per member, read once
    the plan's jobs have ended: the state is a record, not the authority, and its ``orch wait`` does not install
    the plan again."""
    found = {}
    for m in members:
        ours = [mark for mark in read_marks(m) if mark.installed.plan_id == plan.id]
        done = adopt_marks(m, TuningRecord(), ours, device=plan.device, commit=plan.commit,
                           files=m.runner, look=True).installed  # fmt: skip
        if not {s.key for s in plan.shapes} <= set(done):
            return {}
        found[m.name] = done
    return found


def record_installed_by_another(member: HostSession, plan: PlanRecord, done: dict[str, InstalledRecord]) -> str:
    """Record ``done`` (``installed_by_another``) as the member's running ``plan`` installed (phase ``tuned``), unless
    the state moved on meanwhile; what to say of it."""
    said = (
        f"installed by another orch (plan {plan.id}; marked in {member.host.workdir.rstrip('/')}/{MARKS}): "
        "recorded, not installed again"
    )

    def apply(hs: HostState, record: TuningRecord) -> None:
        if (record.plan_id, record.state) != (plan.id, "running"):
            return
        record.installed.update(done)
        record.state, record.reason, record.log_tail = "installed", None, None
        hs.tuned(f"tuned FP8 configs of plan {plan.id} {said}")

    edit_record(member.store, member.name, apply)
    return said


def overtaking(plan: PlanRecord, marks: Iterable[InstallMark]) -> list[InstallMark]:
    """The install marks (``marks``, as read from the host) that make the failed ``plan`` done all the same: those
    for its GPU and SGLang commit installed since it was made, when they cover every shape of it; else none."""
    made = (plan.device, plan.commit)
    since = [
        m
        for m in marks
        if (m.installed.device, m.installed.commit) == made and m.installed.installed_at >= plan.created_at
    ]
    return since if {s.key for s in plan.shapes} <= {m.key for m in since} else []


def _overtaken(hs: HostState, record: TuningRecord, plan_id: str, marked: dict[str, InstalledRecord], by: str) -> None:
    if (record.plan_id, record.state) != (plan_id, "failed"):  # another orch of this state moved on meanwhile
        return
    record.installed.update(marked)
    record.state, record.reason, record.log_tail = "installed", None, None
    hs.nothing_to_tune(f"tuned configs installed on the host by orch (plan {by}) after this state's plan failed")


def _file(section: probe.Section | None) -> bytes | None:
    if section is None or not section.ok:
        return None
    try:
        return base64.b64decode(section.output.strip(), validate=True)
    except ValueError:
        return None


def discover_tuner(host: Host, runner: Runner) -> tuple[str, frozenset[str]]:
    """The tuner's path and flags, in a command of their own (``discover`` reads them with the rest)."""
    result = runner.run(tf.find_tuner_argv(host.python, host.sglang_dir), timeout=300)
    return tuner_of(host, CommandResult(result.argv, result.exit_status, result.stdout + result.stderr, ""))


def tuner_of(host: Host, result: CommandResult) -> tuple[str, frozenset[str]]:
    """The first script of the checkout that exists decides. Refuse a missing tuner, one whose
    ``--help`` fails (showing its stderr), or one too old to take ``--N/--K``."""
    found = tf.parse_tuner_help(result.stdout, result.exit_status)
    if found.script is None:
        raise RefusedError(
            f"{host.name}: no block-FP8 tuner in {host.sglang_dir} ({tf.TUNER_SCRIPT})",
            hint="check sglang_dir in the inventory, or update SGLang: orch pull",
        )
    if found.exit_status != 0:
        raise RefusedError(
            f"{host.name}: the tuner fails: {tf.help_failure(found.script, found.exit_status, found.stderr)}",
            hint=f"an ImportError there usually means the tuner and the installed SGLang disagree: "
            f"reinstall SGLang from this checkout (orch pull --install --host {host.name}), "
            f"or check python in the inventory ({host.python})",
        )
    return found.script, _checked_flags(host, found.script, found.help)


def _checked_flags(host: Host, path: str, help_text: str) -> frozenset[str]:
    flags = tf.parse_help_flags(help_text)
    try:
        tf.check_flags(path, flags)
    except tf.TunerTooOld as exc:
        raise RefusedError(f"{host.name}: tuner too old: {exc}", hint="update SGLang: orch pull") from None
    return flags


def runtime_of(host: Host, result: CommandResult) -> tf.RuntimeFacts:
    facts = tf.parse_discover(result.stdout)
    if facts.config_dir is None:
        why = "; ".join(facts.errors) or result.stderr.strip()[-300:]
        raise RefusedError(
            f"{host.name}: cannot import SGLang's fp8_kernel with {host.python} ({why})",
            hint=f"install SGLang for that interpreter: orch pull --install --host {host.name}",
        )
    return facts


def holders_of(host: Host, devs: CommandResult, apps: CommandResult) -> tuple[list[smi.Gpu], list[smi.Holder]]:
    """The GPUs and the processes holding them (from the two nvidia-smi queries, joined by
    ``smi.holders``), not tied to orch jobs."""
    devices = smi.parse_gpus(smi.answer(host.name, devs))
    held = smi.holders(devices, smi.parse_apps(smi.answer(host.name, apps)))
    return devices, [smi.Holder(gpu, a.pid, a.process_name) for gpu, a in held]


def selected_gpus(host: Host, facts: HostFacts) -> list[int]:
    """The GPU indexes orch tunes on: the first ``gpus`` (inventory) of those nvidia-smi lists."""
    return [g.index for g in facts.gpus][: host.gpus]


@dataclass
class Prepared:
    """A host ready to tune (``facts``, the shapes it needs) or to attach to (``attach``)."""

    session: HostSession
    attach: PlanRecord | None = None
    facts: HostFacts | None = None
    shapes: list[Shape] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    tp_size: int = 8
    note: str | None = None  # why there is nothing to tune, when the shapes' source says so
    kept: list[KeptRecord] = field(default_factory=list)  # units an earlier, failed plan finished here
    costs: tf.Costs = field(default_factory=tf.Costs)  # what the schedule counts (the recipe's tuning costs)
    block: tuple[int, int] = tf.DEFAULT_BLOCK  # the model's FP8 blocks (its config.json)
    server: ServerRecord | None = None  # the host's server as recorded when prepare read the state
    stuck_after_s: float = STUCK_AFTER_S  # the recipe's tuning.stuck_after_s

    @property
    def host(self) -> Host:
        return self.session.host


BeforeStop = Callable[[HostSession, Recipe], None]
"""What ``--stop-server`` does on a host before its server is stopped for tuning (``orch tune-fp8`` with a
gateway: the host leaves it and drains, ``ops.rollout.leave_before_stop``)."""


def prepare(
    session: HostSession,
    recipe: Recipe,
    options: TuneOptions,
    look: bool = False,
    before_stop: BeforeStop | None = None,
) -> Prepared:
    """Attach to a running plan, or discover, resolve shapes, skip installed ones and check GPUs. A plan
    recorded running whose jobs were lost is failed first (``settle_lost``). ``look``: change nothing
    (``orch run``'s dry run and outage check): such a plan is taken as failed without recording it. The
    host's record is first tied to the machine it is (``HostSession.claim_machine``): another machine's
    tuning is never taken as this one's."""
    session.claim_machine()
    host, runner, store = session.host, session.runner, session.store
    state = store.read([host.name])
    record = record_of(state.hosts.get(host.name))
    plan = plan_of(state, record)
    running = plan.id if record.state == "running" and plan is not None else None
    server = hs.server if (hs := state.hosts.get(host.name)) is not None else None
    if running is not None and plan is not None:
        record, plan = settle_lost(session, record, plan, look)
    sizes = list(options.batch_sizes or ())  # asked (--batch-sizes): the plan tunes them too; else any plan's do
    if record.state == "running" and plan is not None:  # a shape asked is tuned by the plan or installed already
        asked = asked_shapes(session, recipe, options, plan.device)
        refuse_unplanned(session, plan, asked, {} if options.force else record.installed, sizes)
        return Prepared(session, attach=plan, server=server)
    checked = [] if options.force else files_to_check(host, record, plan)
    facts, files = discover(session, [*checked, model_config_path(host)])
    adopted = adopt_host_plan(session, record, facts.open_plans, look) if record.state != "running" else None
    if adopted is not None:  # installed: as the record and orch's marks on the host say, the files still there
        marked = adopt_marks(session, record, facts.marks, device=facts.device, commit=facts.commit, files=files,
                             look=True).installed  # fmt: skip
        asked = asked_shapes(session, recipe, options, facts.device)
        refuse_unplanned(session, adopted, asked, {} if options.force else marked, sizes, files)
        return Prepared(session, attach=adopted, server=server)
    block = model_block(session, files, facts.flags)
    tp = server_facts.recipe_tp_size(recipe, host.gpus)  # the recipe's, else the host's GPU count
    logged = logged_shapes(session, facts.device) if options.shapes == "logged" else None
    wanted = logged.shapes if logged else resolve_shapes(options.shapes, recipe, session, tp)
    batch_sizes = list(options.batch_sizes or recipe.tuning.batch_sizes)
    if not options.force:
        record = adopt_marks(
            session, record, facts.marks, device=facts.device, commit=facts.commit, files=files, look=look
        )
    skipped = [] if options.force else installed_shapes(files, record, facts, wanted, batch_sizes)
    needed = [s for s in wanted if s.key not in skipped]
    kept = [] if options.force else kept_results(files, record, plan, facts, wanted_units(needed, batch_sizes))
    if needed and options.stop_server:
        if before_stop is not None:
            before_stop(session, recipe)
        gpus, drain = server_facts.server_gpus(recipe, host), ServeOptions().drain_timeout
        srv.stop_running_server(srv.warning_session(host, runner, store), gpus, drain, srv.FOR_TUNE_FP8, server)
        session.forget("jobs", "gpus", "server_info")  # the server job ended, its GPUs released
        facts.holders = session.gpus(selected_gpus(host, facts)).holders
    # a plan another orch recorded while this one looked; read after the GPUs: plans are recorded before
    # their jobs start, so GPUs busy with that plan's jobs are adopted, never refused as someone else's
    other = running_plan(store.read([host.name]), host.name) if needed else None
    if other is not None and not (look and other.id == running):  # looking: a lost plan is still recorded
        refuse_other_shapes(host.name, other, needed, {}, sizes)
        return Prepared(session, attach=other, server=server)  # another orch planned meanwhile: adopt its plan
    if needed:
        refuse_busy(host, facts, options.allow_busy_gpus, lambda: _job_id(session.running_server()))
    note = logged.note if logged else None
    costs = tf.Costs(recipe.tuning.tuner_startup_s, recipe.tuning.tuner_unit_s)
    return Prepared(
        session, facts=facts, shapes=needed, skipped=skipped, batch_sizes=batch_sizes, tp_size=tp, note=note,
        kept=kept, costs=costs, block=block, server=server, stuck_after_s=recipe.tuning.stuck_after_s,
    )  # fmt: skip


def model_config_path(host: Host) -> str:
    return f"{host.model_path.rstrip('/')}/config.json"


def model_block(session: HostSession, files: FileReader, flags: frozenset[str]) -> tuple[int, int]:
    """The model's FP8 block shape, from its ``config.json`` read in the discovery round trip; the
    tuner's default [128, 128] when the host has no readable model config (tuning needs no model). A
    block other than [128, 128] is said with what it means for the backend (``tf.block_note``), and
    refused when the tuner cannot be told it (no ``--block-n/--block-k``: it would tune [128, 128])."""
    host = session.host
    path = model_config_path(host)
    try:
        config = json.loads(files.read_bytes(path))
    except (OSError, ValueError, RecursionError):
        return tf.DEFAULT_BLOCK
    try:
        block = tf.block_shape(config)
    except tf.BlockShapeError as exc:
        raise RefusedError(f"{host.name}: {path}: {exc}") from None
    note = tf.block_note(block)
    if note and not {"--block-n", "--block-k"} <= flags:
        raise RefusedError(f"{host.name}: {note}; this tuner has no --block-n/--block-k to tune them")
    if note:
        session.say(note)
    return block


def settle_lost(
    session: HostSession, record: TuningRecord, plan: PlanRecord, look: bool
) -> tuple[TuningRecord, PlanRecord | None]:
    """``record``, running ``plan``, as ``prepare`` goes on from (with the plan it then names). The plan
    was lost when no job of it runs any more and one or more was lost (its process gone without an exit
    code, e.g. by a reboot) or is missing (one job listing tells): then it is failed as the watch would
    (``complete_group``: same reason, phase ``failed``; only in the returned copy when ``look``), so
    this re-run tunes afresh, keeping the finished runs, instead of attaching to jobs that are gone.
    Else ``record`` as it is: a plan whose jobs all ended with an exit code is left to the watch (it
    installs, or reports the failure with its log tail), a job whose start is not recorded yet counts
    as running (the watch finds or starts it), and a ``--fleet`` plan (or a host that does not answer)
    is left to the watch, which reaches every member and rides out outages."""
    host, store = session.host, session.store
    if plan.group != [host.name]:
        return record, plan
    current: PlanRecord | None
    try:
        if look:
            polls, cached, current = {host.name: poll_host(session, plan, record)}, {host.name: record}, plan
        else:
            polls, state = poll_group([session], plan)
            cached = records(state, [host.name])
            current = plan_of(state, cached[host.name])
    except UnreachableError:
        return record, plan  # attached to as before: the watch rides out the outage
    now = cached[host.name]
    if now.state != "running" or current is None or current.id != plan.id:
        return now, current  # another orch completed it (or planned anew) meanwhile
    states = {v.state for v in job_views(current, polls, cached)}
    if "running" in states or not states & {"lost", "missing"}:
        return now, current
    if look:
        return now.model_copy(update={"state": "failed", "reason": failure(session, current, polls)}), current
    complete_group([session], current, polls)
    state = store.read([host.name])
    now = record_of(state.hosts.get(host.name))
    if now.state == "failed" and now.plan_id == plan.id:
        log.warning("%s: tuning plan %s failed: %s; tuning afresh", host.name, plan.id, now.reason)
    return now, plan_of(state, now)


def failure(session: HostSession, plan: PlanRecord, polls: dict[str, HostPoll]) -> str:
    """Why ``plan`` failed, as ``complete_group`` records it."""
    infos = polls[session.name].infos
    failed = [(a, infos.get(a.job_id or "")) for a in plan.assignments]
    return describe_failure([session], [(a, i) for a, i in failed if i is None or i.state != "succeeded"], polls)[0]


def resolve_shapes(spec: str, recipe: Recipe, session: HostSession, tp: int) -> list[Shape]:
    """``default`` (the recipe's list), ``auto`` (from the model's config.json) or ``N=..,K=..;...``
    (``logged`` needs the GPU's name: ``logged.logged_shapes``)."""
    if spec == "default":
        if not recipe.tuning.shapes:
            raise ConfigError(
                f"playbook {recipe.path or recipe.model} has no tuning.shapes; use --shapes auto or a list"
            )
        return list(recipe.tuning.shapes)
    if spec == "auto":
        return auto_shapes(session, tp)
    return parse_shapes(spec)


def refuse_unplanned(
    session: HostSession, plan: PlanRecord, asked: Sequence[Shape], installed: Mapping[str, InstalledRecord],
    sizes: Sequence[int], files: ReadAhead | None = None,
) -> None:  # fmt: skip
    """``attach.refuse_other_shapes`` for attaching to ``plan``, counting the ``installed`` configs whose file the
    host still has (``installed_here``, through ``files``). Those are looked for only when a shape asked is left
    out of the plan: attaching with the plan's own shapes (a re-run, ``orch run``) costs no round trip."""
    found = installed_here(session, installed, files) if left_out(plan, asked, {}, sizes) else {}
    refuse_other_shapes(session.name, plan, asked, found, sizes, lambda: ended_here(session, plan))


def ended_here(session: HostSession, plan: PlanRecord) -> bool:
    """Whether every job of ``plan``, a plan of this host alone, has ended: each assignment's job found on the
    host (its recorded id, else by purpose and staging directory: a plan adopted from the host records none)
    and none runs. A ``--fleet`` plan's other members are not read: False."""
    if plan.group != [session.name]:
        return False
    listed = session.jobs()
    for a in plan.on(session.name):
        job = next((j for j in reversed(listed) if _job_of(session, j, a)), None)
        if job is None or job.running:
            return False
    return True


def _job_of(session: HostSession, job: jobs.JobInfo, a: AssignmentRecord) -> bool:
    """Whether ``job`` is assignment ``a``'s: its recorded id, else its purpose with ``a``'s staging directory in
    its command."""
    if a.job_id is not None:
        return job.id == a.job_id
    if job.purpose != a.purpose:
        return False
    try:
        return a.staging.encode() in session.job_argv(job.id)
    except OSError:
        return False


def installed_here(
    session: HostSession, installed: Mapping[str, InstalledRecord], files: ReadAhead | None = None
) -> dict[str, InstalledRecord]:
    """Of ``installed`` (configs recorded or marked installed), those whose file the host still has: as ``files``
    (the discovery round trip, ``adopt_marks``) read it, the others in one command (none: no command). A config
    removed since is tuned again, never taken as done."""
    known = files.files if files is not None else {}
    found = {path for path, data in known.items() if data is not None}
    paths = list(dict.fromkeys(r.path for r in installed.values() if r.path not in known))
    if paths:
        script = 'for p; do [ -f "$p" ] && printf "%s\\n" "$p"; done; true'
        argv = ["sh", "-c", script, "orch-installed", *paths]
        found |= set(session.runner.run(argv, check=True, timeout=60).stdout.splitlines())
    return {key: r for key, r in installed.items() if r.path in found}


def asked_shapes(session: HostSession, recipe: Recipe, options: TuneOptions, device: str) -> list[Shape]:
    """The shapes ``options.shapes`` asks, to check a plan running on the host against
    (``attach.refuse_other_shapes``). Shapes read from the host (``auto``, ``logged``) that it cannot tell now
    (a host that does not answer, no Triton server's log) are none: the running plan is attached to as before,
    and the watch rides out the outage."""
    try:
        if options.shapes == "logged":
            return logged_shapes(session, device).shapes
        return resolve_shapes(options.shapes, recipe, session, server_facts.recipe_tp_size(recipe, session.host.gpus))
    except HostError:
        if options.shapes in ("auto", "logged"):
            return []
        raise


def auto_shapes(session: HostSession, tp: int) -> list[Shape]:
    host = session.host
    path = f"{host.model_path.rstrip('/')}/config.json"
    try:
        config = json.loads(session.runner.read_bytes(path))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested absurdly deep
        raise RefusedError(f"{host.name}: cannot read the model's {path}: {exc}") from None
    try:
        return tf.shapes_from_model_config(config, tp)
    except tf.UnknownArchitecture as exc:
        raise RefusedError(f"{host.name}: --shapes auto: {path}: {exc}", hint="pass --shapes N=..,K=..;...") from None


def files_to_check(host: Host, record: TuningRecord, plan: PlanRecord | None) -> list[str]:
    """The files ``installed_shapes`` and ``kept_results`` may read, for ``discover`` to read with the rest."""
    installed = [done.path for done in record.installed.values()]
    if record.state != "failed" or plan is None:
        return installed
    results = [_run_result(plan, a, r, False).path for a in plan.on(host.name) for r in a.runs]
    return list(dict.fromkeys([*installed, *(k.path for k in plan.kept_on(host.name)), *results]))


def installed_shapes(
    runner: FileReader, record: TuningRecord, facts: HostFacts, shapes: Iterable[Shape], batch_sizes: Sequence[int]
) -> list[str]:
    """Keys of ``shapes`` whose installed config is complete for this device and commit (re-read on the host)."""
    return [s.key for s in shapes if _installed_complete(runner, record.installed.get(s.key), facts, batch_sizes)]


def _installed_complete(
    runner: FileReader, done: InstalledRecord | None, facts: HostFacts, batch_sizes: Sequence[int]
) -> bool:
    if done is None or (done.device, done.commit) != (facts.device, facts.commit):
        return False
    try:
        configs = tf.parse_config(runner.read_bytes(done.path), done.path)
    except (OSError, tf.ConfigInvalid):
        return False
    return not tf.missing_batch_sizes(configs, batch_sizes)


def kept_results(
    runner: FileReader,
    record: TuningRecord,
    plan: PlanRecord | None,
    facts: HostFacts,
    wanted: Mapping[str, Sequence[int]],
) -> list[KeptRecord]:
    """What the host's last plan finished before it failed (its jobs lost to a reboot, say), for a new
    plan to keep rather than tune again: each run's result file on this host (and the files that plan
    itself kept), when that plan was for this device, commit and Triton, for shapes and batch sizes still
    ``wanted`` (shape key → its batch sizes, ``wanted_units``). Each file is re-read and trusted only
    whole (``tf.finished_run``): one missing, cut short or wrong is left out, and its units are tuned
    again. ``plan``: the one ``record`` names; ``facts``: the host's, as ``discover`` found them."""
    host = facts.host
    if record.state != "failed" or plan is None:
        return []
    if (plan.device, plan.commit, plan.triton) != (facts.device, facts.commit, facts.triton):
        return []
    lost = "was lost" in (record.reason or "")
    results = [_run_result(plan, a, r, lost) for a in plan.on(host.name) for r in a.runs]
    kept = []
    for candidate in [*plan.kept_on(host.name), *results]:
        sizes = [m for m in candidate.batch_sizes if m in wanted.get(candidate.key, ())]
        if sizes and _finished(runner, candidate):
            kept.append(candidate.model_copy(update={"batch_sizes": sizes}))
    return kept


def wanted_units(shapes: Iterable[Shape], batch_sizes: Sequence[int]) -> dict[str, Sequence[int]]:
    """The units a new plan wants, by shape key: every batch size of each shape."""
    return {s.key: batch_sizes for s in shapes}


def _run_result(plan: PlanRecord, a: AssignmentRecord, run: RunRecord, lost: bool) -> KeptRecord:
    path = f"{a.staging}/{tf.config_file_name(run.n, run.k, plan.device, plan.block_shape)}"
    fields = {"host": a.host, "path": path, "N": run.n, "K": run.k, "batch_sizes": run.batch_sizes}
    return KeptRecord.model_validate({**fields, "plan_id": plan.id, "lost": lost})


def _finished(runner: FileReader, kept: KeptRecord) -> bool:
    try:
        tf.finished_run(runner.read_bytes(kept.path), f"{kept.host}:{kept.path}", kept.batch_sizes)
    except (OSError, tf.ConfigInvalid):
        return False
    return True


def _job_id(job: jobs.JobInfo | None) -> str | None:
    return job.id if job is not None else None


def refuse_busy(host: Host, facts: HostFacts, allow: bool, server: Callable[[], str | None] = lambda: None) -> None:
    """Refuse GPUs held by other processes (``smi.foreign_holders``: every holder of a GPU to tune on),
    naming each pid and process (``smi.busy_message``), unless ``allow``. ``server()``: the job id of orch's
    server running on the host (None: none runs), which the hint names (``--stop-server`` stops it); asked
    only when refusing (it may cost a round trip)."""
    selected = selected_gpus(host, facts)
    held = sorted((h for h in facts.holders if h.gpu in selected), key=lambda h: selected.index(h.gpu))
    if smi.foreign_holders(held) and not allow:
        running = server()
        if running is not None:
            hint = (
                f"orch's server (job {running}) runs on {host.name}: --stop-server stops it for the tuning, saying "
                "so (`orch serve` serves again after); stop any other process, or pass --allow-busy-gpus"
            )
        else:
            hint = "no server of orch's runs there: stop those processes, or pass --allow-busy-gpus"
        raise RefusedError(smi.busy_message(host.name, "GPUs are busy", held, owners=False), hint=hint)
