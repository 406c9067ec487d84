"""Detached jobs on a host: started so they outlive the SSH session and orch, tracked by files.

Layout on the host, all under ``workdir`` (mode 0700)::

    jobs/<job-id>/argv        the command, NUL-separated       env         K=V lines (non-secret)
                 purpose     the dedup key                     log         stdout+stderr
                 pid         the wrapper's pid (= its pgid)    starttime   /proc/<pid>/stat field 22
                 boot_id     the kernel boot it started in     exit_code   written when the command ends
                 started_at  ended_at (epoch seconds; the start's  stop_requested  when orch stop asked
                             with its nanoseconds)                         (one line: who asked, or empty)
    purposes/<purpose>        symlink to the job that holds that purpose
    live/<job-id>             an empty file per job not yet seen ended (the index of live jobs)
    jobs.index                one listing line per ended job, appended when a listing first sees it ended

A listing reads the job directories of the ``live/`` jobs only, and the ended ones' lines from
``jobs.index``: its cost grows with the live jobs, not with every job ever started (a line of the
index is final: an ended job's exit code, times and log no longer change). A host whose jobs predate
the index gets one, once: every job directory counts as live until a listing sees it ended.
``find`` and ``wait`` read one job's directory; ``wait`` blocks on the host until the job ends (or its
log grows) or a deadline passes, so an exit is seen at once without polling faster.

The host's inventory ``env`` reaches the job through its environment (the runner passes it on
stdin, never on a command line); ``JobSpec.env`` is on the job's command line and holds no secrets.
A job is started by ``setsid`` with stdin from /dev/null and stdout/stderr to its log, and with no
descriptor of the SSH channel left open (else the channel would stay open until the job ended).
A small wrapper shell writes the pid and start time, waits for the command and writes its exit code,
also when it fails. State: ``running`` (pid alive, not a zombie, with the same start time and boot), ``succeeded``
/ ``failed`` (exit code), ``lost`` (process gone and no exit code: rebooted, SIGKILLed).
Starting a job for a purpose whose job still runs attaches to it instead (under a host-side flock,
so two orch processes cannot both start one); a job whose spec ``excludes`` purposes is not started while
a job of one of them runs (checked under the same lock: ``JobBusyError``). ``stop`` only ever signals the
job's own process group, after checking pid, start time and boot id: orch never kills what it did not start.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from orchestrator.errors import RefusedError, RemoteCommandError, UsageError
from orchestrator.text import looks_secret
from orchestrator.transport.base import Runner

_PURPOSE = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,80}$")

# Every script below runs after this (``_script``): a live process's start time, field 22 of
# /proc/<pid>/stat counted after the LAST ") ", since the process name before it (comm, in parentheses)
# may hold spaces and ")"; nothing for a zombie (state Z or X: dead, only not reaped yet). And the one
# "is this job still alive" check that start (attach), list and stop share.
_STARTTIME = r"""
starttime() {
  _stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  _stat=${_stat##*") "}
  case $_stat in [ZX]*) return 0 ;; esac
  printf '%s\n' "$_stat" | cut -d' ' -f20
}
# job_alive DIR PID BOOT: the job in DIR still runs as PID, with the start time and in the boot it
# recorded (after a reboot a pid, and a start time counted from boot, can belong to anyone).
job_alive() {
  [ -n "$2" ] && [ -r "/proc/$2/stat" ] && [ "$(starttime "$2")" = "$(cat "$1/starttime" 2>/dev/null)" ] \
    && [ "$(cat "$1/boot_id" 2>/dev/null)" = "$3" ]
}
# session_alive SID: a live process (not a zombie) is in session SID. A job's wrapper is its session's
# leader (setsid), so its command runs in session <wrapper pid>; a pid is not reused while a session of
# that id has members, so a member is the job's command, outliving its wrapper (the wrapper SIGKILLed).
session_alive() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v sid="$1" \
    '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); if (f[4] == sid && f[1] !~ /^[ZX]/) found = 1 }
     END { exit !found }'
}
# job_runs DIR PID BOOT: job_alive, or its wrapper is gone without an exit code while its command runs on
# in the job's session, in the boot it recorded (prints 2 then: the row's "alive" value for it). No process
# may have the wrapper's pid then: a pid with a process is the wrapper (job_alive) or a reuse, never ours.
job_runs() {
  job_alive "$1" "$2" "$3" && return 0
  [ -n "$2" ] && [ ! -e "/proc/$2" ] && [ ! -e "$1/exit_code" ] && [ "$(cat "$1/boot_id" 2>/dev/null)" = "$3" ] \
    && session_alive "$2" && echo 2
}
# row DIR BOOT: sets line to the job's listing line (see parse_list), and final=1 when the line can no longer
# change: the job has an exit code, or its process is gone without one (lost) and no stop is under
# way (a stop that SIGKILLs writes the exit code after the process is gone). alive is 1 while the
# wrapper runs, 2 while only its command does (the wrapper killed), 0 otherwise.
row() {
  pid=$(cat "$1/pid" 2>/dev/null || true)
  alive=0; orphan=$(job_runs "$1" "$pid" "$2") && alive=${orphan:-1}
  stop=0; by=""
  if [ -e "$1/stop_requested" ]; then
    stop=1; [ -L "$1/stop_requested" ] || by=$(head -n 1 "$1/stop_requested" 2>/dev/null | tr -d '\t\r' | cut -c1-100)
  fi
  code=$(cat "$1/exit_code" 2>/dev/null)
  final=0
  if [ -n "$code" ] || { [ -n "$pid" ] && [ $alive = 0 ] && [ $stop = 0 ]; }; then final=1; fi
  size=$(stat -c %s "$1/log" 2>/dev/null || echo 0)
  line=$(printf 'job\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "${1##*/}" "$(cat "$1/purpose" 2>/dev/null)" \
    "$pid" "$alive" "$code" "$(cat "$1/started_at" 2>/dev/null)" "$(cat "$1/ended_at" 2>/dev/null)" "$size" "$stop" \
    "$by")
}
# no_links WORKDIR: exit 78 naming the first of orch's own paths in WORKDIR (or WORKDIR itself) that is a
# symbolic link: orch never follows a link it did not make (it would chmod, fill or truncate the target).
no_links() {
  for _p in "$1" "$1/jobs" "$1/purposes" "$1/live" "$1/jobs.lock" "$1/jobs.index"; do
    if [ -L "$_p" ]; then
      echo "orch: $_p is a symbolic link; orch does not follow a link it did not make" \
        "(point workdir at the real directory, or remove the link)" >&2
      exit 78
    fi
  done
}
# job_of LINK WORKDIR: print the job directory purpose link LINK names, when it is one of WORKDIR/jobs/ and no
# link itself (orch never follows a link elsewhere); fail otherwise.
job_of() {
  [ -L "$1" ] || return 1
  _j=$(readlink "$1")
  case $_j in "$2"/jobs/*) ;; *) return 1 ;; esac
  [ -d "$_j" ] && [ ! -L "$_j" ] && printf '%s\n' "$_j"
}
# index_jobs WORKDIR: give a host whose jobs predate the index one (the caller holds jobs.lock):
# every job directory is live until a listing sees it ended.
index_jobs() {
  [ -e "$1/jobs.index" ] && return 0
  mkdir -p "$1/live"
  for _d in "$1"/jobs/*/; do [ -d "$_d" ] || continue; _d=${_d%/}; : > "$1/live/${_d##*/}"; done
  : > "$1/jobs.index"
}
"""

# $1 = dir, then the command. Runs as the session leader made by setsid.
_WRAPPER = r"""
dir=$1; shift
starttime $$ > "$dir/starttime"
cat /proc/sys/kernel/random/boot_id > "$dir/boot_id" 2>/dev/null || echo none > "$dir/boot_id"
echo $$ > "$dir/pid.tmp" && mv "$dir/pid.tmp" "$dir/pid"
trap 'echo "orch: job received a signal; waiting for the command to exit" >&2' TERM INT HUP
"$@" &
child=$!
while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done
date +%s > "$dir/ended_at"
echo "$rc" > "$dir/exit_code.tmp" && mv "$dir/exit_code.tmp" "$dir/exit_code"
"""

# $1 workdir, $2 job id, $3 purpose, $4 the purposes it excludes (space-separated), $5 wrapper, $6 number of
# env pairs N, then the command, which is `env K=V ... argv` with N pairs.
_START = r"""
set -eu
workdir=$1; id=$2; purpose=$3; excludes=$4; wrapper=$5; nenv=$6; shift 6
umask 077
no_links "$workdir"
mkdir -p "$workdir/jobs" "$workdir/purposes"
chmod 700 "$workdir" "$workdir/jobs"
exec 9>>"$workdir/jobs.lock"
flock -w 30 9 || { echo "orch: another orch is starting a job on this host" >&2; exit 75; }
link="$workdir/purposes/$purpose"
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
if [ -L "$link" ]; then
  old=$(readlink "$link")
  if [ ! -e "$old/exit_code" ] && [ -s "$old/pid" ]; then
    pid=$(cat "$old/pid")
    if job_runs "$old" "$pid" "$boot" >/dev/null; then echo "attached ${old##*/} $pid"; exit 0; fi
  fi
fi
for other in $excludes; do
  [ -L "$workdir/purposes/$other" ] || continue
  old=$(readlink "$workdir/purposes/$other")
  if [ ! -e "$old/exit_code" ] && [ -s "$old/pid" ]; then
    pid=$(cat "$old/pid")
    if job_runs "$old" "$pid" "$boot" >/dev/null; then echo "busy ${old##*/} $pid"; exit 0; fi
  fi
done
index_jobs "$workdir"
dir="$workdir/jobs/$id"
mkdir -m 700 "$dir"
trap 'rm -rf -- "$dir" "$workdir/live/$id"' EXIT  # a start that fails half-written (a full disk) leaves nothing
: > "$workdir/live/$id"
: > "$dir/env"
i=0; for a in "$@"; do [ $i -ge 1 ] && [ $i -le "$nenv" ] && printf '%s\n' "$a" >> "$dir/env"; i=$((i + 1)); done
printf '%s\0' "$@" > "$dir/argv"
printf '%s\n' "$purpose" > "$dir/purpose"
date +%s.%N > "$dir/started_at"  # to the nanosecond: a config written in the same second is told before or after
trap - EXIT
setsid sh -c "$wrapper" orch-job "$dir" "$@" </dev/null >"$dir/log" 2>&1 9>&- &
i=0; while [ ! -s "$dir/pid" ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i + 1)); done
ln -sfn "$dir" "$link"
echo "started $id $(cat "$dir/pid" 2>/dev/null || echo 0)"
"""

# $1 workdir: one line per job (see parse_list): the live jobs' from their directories, then the
# ended ones' from the index. A live job seen ended is appended to the index, then leaves live/ (in that
# order: a listing at the same time finds it in one or the other; parse_list keeps a job's last line).
_LIST = r"""
workdir=$1
umask 077
no_links "$workdir"
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
if [ -d "$workdir/jobs" ] && [ ! -e "$workdir/jobs.index" ]; then
  (exec 9>>"$workdir/jobs.lock" && flock -w 30 9 && index_jobs "$workdir") 2>/dev/null
fi
if [ -d "$workdir/jobs" ] && [ ! -e "$workdir/jobs.index" ]; then  # could not make it: every directory, as before
  for d in "$workdir"/jobs/*/; do
    [ -d "$d" ] && [ ! -L "${d%/}" ] && row "${d%/}" "$boot" && printf '%s\n' "$line"
  done
  exit 0
fi
for e in "$workdir"/live/*; do
  [ -e "$e" ] || continue
  d="$workdir/jobs/${e##*/}"
  { [ -d "$d" ] && [ ! -L "$d" ]; } || { rm -f "$e"; continue; }  # never a job directory that is a link
  row "$d" "$boot"
  printf '%s\n' "$line"
  [ $final = 1 ] && printf '%s\n' "$line" >> "$workdir/jobs.index" && rm -f "$e"
done
cat "$workdir/jobs.index" 2>/dev/null
printf 'now\t%s\n' "$(date +%s)"
exit 0
"""

# $1 workdir, then job ids: the line of each job that has a directory.
_SHOW = r"""
workdir=$1; shift
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
for id in "$@"; do [ -d "$workdir/jobs/$id" ] && row "$workdir/jobs/$id" "$boot" && printf '%s\n' "$line"; done
printf 'now\t%s\n' "$(date +%s)"
exit 0
"""

# $1 workdir, $2 purpose, then job ids: the host's clock (`now`), the job that holds the purpose (the link the
# last start made, whatever any state file records: `held`, its argv and env files in base64, its line), then
# the line of each other job id given. The link is orch's own and must point into jobs/; else nothing is held.
_HELD = r"""
workdir=$1; purpose=$2; shift 2
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
printf 'now\t%s\n' "$(date +%s)"
if d=$(job_of "$workdir/purposes/$purpose" "$workdir"); then
  printf 'held\t%s\n' "${d##*/}"
  printf 'argv\t%s\n' "$(base64 -w0 < "$d/argv" 2>/dev/null)"
  printf 'env\t%s\n' "$(base64 -w0 < "$d/env" 2>/dev/null)"
  row "$d" "$boot"; printf '%s\n' "$line"
fi
for id in "$@"; do [ -d "$workdir/jobs/$id" ] && row "$workdir/jobs/$id" "$boot" && printf '%s\n' "$line"; done
exit 0
"""

# $1 workdir, $2 a purpose prefix: the listing line of the job each purpose link starting with it names (links
# into jobs/ only, never through a symlinked job directory).
_HOLDERS = r"""
workdir=$1; prefix=$2
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
for link in "$workdir"/purposes/"$prefix"*; do
  if d=$(job_of "$link" "$workdir"); then row "$d" "$boot"; printf '%s\n' "$line"; fi
done
exit 0
"""

# $1 workdir, $2 milliseconds at most, $3 log offset (-1: none), $4 milliseconds before a grown log
# counts, then job ids. Returns (printing each job's line, like _SHOW) when one of the jobs has ended
# (its exit code written, or its process gone), when the first job's log has grown past the offset,
# or after $2 ms. Checked every 0.1 s with shell builtins (test, kill -0), plus one stat for the log.
_WAIT = r"""
workdir=$1; ms=$2; offset=$3; settle=$4; shift 4
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
first="$workdir/jobs/$1"
pids=""
for id in "$@"; do pid=$(cat "$workdir/jobs/$id/pid" 2>/dev/null); pids="$pids ${pid:--}"; done
waited=0
while [ "$waited" -lt "$ms" ]; do
  ended=0
  for id in "$@"; do { [ -e "$workdir/jobs/$id/exit_code" ] || [ ! -d "$workdir/jobs/$id" ]; } && ended=1; done
  for pid in $pids; do
    [ "$pid" = - ] || kill -0 "$pid" 2>/dev/null || { [ ! -e "/proc/$pid" ] && session_alive "$pid"; } || ended=1
  done
  [ $ended = 1 ] && break
  if [ "$offset" -ge 0 ] && [ "$waited" -ge "$settle" ]; then
    [ "$(stat -c %s "$first/log" 2>/dev/null || echo 0)" -gt "$offset" ] && break
  fi
  sleep 0.1; waited=$((waited + 100))
done
for id in "$@"; do [ -d "$workdir/jobs/$id" ] && row "$workdir/jobs/$id" "$boot" && printf '%s\n' "$line"; done
printf 'now\t%s\n' "$(date +%s)"
exit 0
"""

# $1 job dir, $2 seconds to wait after SIGTERM before SIGKILL, $3 who asks (one line, kept in stop_requested).
_STOP = r"""
dir=$1; grace=$2; by=${3:-}
[ -e "$dir/exit_code" ] && { echo "ended"; exit 0; }
pid=$(cat "$dir/pid" 2>/dev/null || true)
boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
alive() { job_runs "$dir" "$pid" "$boot" >/dev/null; }  # the wrapper, or its command outliving it
alive || { echo "lost"; exit 0; }
[ -L "$dir/stop_requested" ] || printf '%s\n' "$by" > "$dir/stop_requested"  # never through a link orch did not make
kill -s TERM -- "-$pid" 2>/dev/null || true
end=$(( $(date +%s) + grace ))
while alive && [ ! -e "$dir/exit_code" ]; do
  if [ "$(date +%s)" -ge "$end" ]; then
    kill -s KILL -- "-$pid" 2>/dev/null || true
    while alive; do sleep 0.1; done
    [ -e "$dir/exit_code" ] || { date +%s > "$dir/ended_at"; echo 137 > "$dir/exit_code"; }
    echo "killed"; exit 0
  fi
  sleep 0.2
done
while alive; do sleep 0.1; done
[ -e "$dir/exit_code" ] || { date +%s > "$dir/ended_at"; echo 143 > "$dir/exit_code"; }  # no wrapper to write it
echo "stopped"
"""


@dataclass(frozen=True)
class JobSpec:
    """What to run: ``purpose`` is the dedup key (e.g. ``tune.gpu3``, ``server``); ``excludes``: the
    purposes whose running job this one never runs beside (its start is refused: ``JobBusyError``)."""

    kind: str
    purpose: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    excludes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for purpose in (self.purpose, *self.excludes):
            if not _PURPOSE.match(purpose):
                raise UsageError(f"job purpose {purpose!r} must match {_PURPOSE.pattern}")
        if not self.argv:
            raise UsageError("a job needs a command")


@dataclass(frozen=True)
class JobInfo:
    id: str
    purpose: str
    pid: int | None
    state: str  # running | succeeded | failed | lost
    exit_code: int | None
    started_at: datetime | None
    ended_at: datetime | None
    log_size: int
    stop_requested: bool
    dir: str
    seen_at: datetime | None = None  # the host's clock when it listed the job (its times are the host's too)
    wrapper_gone: bool = False  # running: its command runs on, its wrapper was killed (no exit code will come)
    stopped_by: str = ""  # who asked the stop, as its job directory says (``stop``'s ``by``); "" when not said

    def age(self, now: datetime) -> float:
        """Seconds since the job started, counted by the host's clock when the listing had it (``seen_at``;
        else ``now``): a host clock behind or ahead of the controller's never makes it negative or hours."""
        if self.started_at is None:
            return 0.0
        return max(0.0, ((self.seen_at or now) - self.started_at).total_seconds())

    def ran_for(self, now: datetime) -> float:
        """Seconds the job ran: to its end when it has ended, else its ``age``."""
        if self.started_at is not None and self.ended_at is not None:
            return max(0.0, (self.ended_at - self.started_at).total_seconds())
        return self.age(now)

    @property
    def log(self) -> str:
        return f"{self.dir}/log"

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class Started:
    job_id: str
    pid: int
    attached: bool  # True: a job for this purpose was already running; nothing new was started


def new_job_id(spec: JobSpec, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S")
    return f"{spec.purpose.replace(':', '-')}-{stamp}-{secrets.token_hex(2)}"


def job_dir(workdir: str, job_id: str) -> str:
    """The job's directory on the host (the layout in the module docstring)."""
    return f"{workdir}/jobs/{job_id}"


def _script(body: str) -> str:
    return _STARTTIME + body


def start_argv(workdir: str, job_id: str, spec: JobSpec) -> list[str]:
    pairs = [f"{k}={v}" for k, v in spec.env.items()]
    for name, value in spec.env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or "\n" in value:
            raise UsageError(f"job environment {name}={value!r}: bad name, or a newline in the value")
        if looks_secret(name):  # these pairs are on the job's command line for its whole life
            raise UsageError(
                f"job environment {name}: looks like a secret, and a job's own env is on its command line",
                hint="put secrets in the host's inventory env: they reach the job through its environment",
            )
    return [
        "sh",
        "-c",
        _script(_START),
        "orch-start",
        workdir,
        job_id,
        spec.purpose,
        " ".join(spec.excludes),
        _script(_WRAPPER),
        str(len(pairs)),
        "env",
        *pairs,
        *spec.argv,
    ]


@dataclass(frozen=True)
class Busy:
    """A start refused: job ``job_id`` of a purpose the spec excludes (``JobSpec.excludes``) runs."""

    job_id: str
    pid: int


def parse_start(stdout: str) -> Started | Busy:
    words = stdout.split()
    if len(words) != 3 or words[0] not in ("started", "attached", "busy"):
        raise ValueError(f"unexpected answer when starting a job: {stdout.strip()!r}")
    if words[0] == "busy":
        return Busy(job_id=words[1], pid=int(words[2]))
    return Started(job_id=words[1], pid=int(words[2]), attached=words[0] == "attached")


def list_argv(workdir: str) -> list[str]:
    return ["sh", "-c", _script(_LIST), "orch-jobs", workdir]


_EPOCH = re.compile(r"\s*(\d+(?:\.\d+)?)")  # seconds, with a fraction where the host's date prints one (%N)


def _epoch(value: str) -> datetime | None:
    found = _EPOCH.match(value)
    return datetime.fromtimestamp(float(found.group(1)), timezone.utc) if found else None


def job_state(alive: bool, exit_code: str) -> str:
    if exit_code.strip().lstrip("-").isdigit():
        return "succeeded" if int(exit_code) == 0 else "failed"
    return "running" if alive else "lost"


def show_argv(workdir: str, job_ids: Sequence[str]) -> list[str]:
    """Reads the directories of ``job_ids`` only (``parse_list`` reads the answer)."""
    return ["sh", "-c", _script(_SHOW), "orch-job", workdir, *map(_checked_id, job_ids)]


def wait_argv(
    workdir: str, job_ids: Sequence[str], seconds: float, log_offset: int | None = None, settle: float = 0.0
) -> list[str]:
    """Blocks on the host until one of ``job_ids`` ends (or is not there: no job), or the first one's log
    grows past ``log_offset`` (counted only after ``settle`` seconds), or ``seconds`` pass; then reads
    them like ``show_argv``."""
    ms, settle_ms = str(max(0, round(seconds * 1000))), str(max(0, round(settle * 1000)))
    offset = str(log_offset) if log_offset is not None else "-1"
    return ["sh", "-c", _script(_WAIT), "orch-job-wait", workdir, ms, offset, settle_ms, *map(_checked_id, job_ids)]


def held_argv(workdir: str, purpose: str, job_ids: Sequence[str] = ()) -> list[str]:
    """Reads the job that holds ``purpose`` on the host (its line, argv and env) and the host's clock, plus
    the lines of ``job_ids`` (``parse_held`` reads the answer): what the host runs, whatever a state file says."""
    if not _PURPOSE.match(purpose):
        raise UsageError(f"job purpose {purpose!r} must match {_PURPOSE.pattern}")
    return ["sh", "-c", _script(_HELD), "orch-held", workdir, purpose, *map(_checked_id, job_ids)]


def holders_argv(workdir: str, purpose_prefix: str) -> list[str]:
    """Reads the job holding each purpose that starts with ``purpose_prefix`` (``parse_list`` reads the
    answer): one cheap look at, say, the tuning jobs a host runs, whatever a state file says."""
    if not _PURPOSE.match(purpose_prefix):
        raise UsageError(f"job purpose {purpose_prefix!r} must match {_PURPOSE.pattern}")
    return ["sh", "-c", _script(_HOLDERS), "orch-holders", workdir, purpose_prefix]


@dataclass(frozen=True)
class Held:
    """``held_argv``'s answer: the host's clock when it answered, the job that holds the purpose (with
    its command and its own ``env`` pairs, as the job directory has them) and the other jobs asked for."""

    host_now: datetime | None
    job: JobInfo | None
    argv: list[str]
    env: dict[str, str]
    others: list[JobInfo]


def parse_held(stdout: str, workdir: str) -> Held:
    fields: dict[str, str] = {}
    for line in stdout.splitlines():
        key, _, value = line.partition("\t")
        if key in ("now", "held", "argv", "env"):
            fields[key] = value
    listed = parse_list(stdout, workdir)
    job = next((j for j in listed if j.id == fields.get("held")), None)
    return Held(
        host_now=_epoch(fields.get("now", "")),
        job=job,
        argv=[a for a in _unbase64(fields.get("argv", "")).split("\0")][:-1],
        env=env_pairs(_unbase64(fields.get("env", ""))),
        others=[j for j in listed if j is not job],
    )


def env_pairs(text: str) -> dict[str, str]:
    """A job's own ``env`` file (``K=V`` lines) as a mapping."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _unbase64(text: str) -> str:
    try:
        return base64.b64decode(text.strip(), validate=True).decode(errors="replace")
    except (ValueError, binascii.Error):
        return ""


_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,200}$")


def _checked_id(job_id: str) -> str:
    """A job id as a single path component (job ids come from the command line too: ``orch stop``)."""
    if not _JOB_ID.match(job_id):
        raise UsageError(f"{job_id!r} is not a job id", hint="job ids are listed by `orch jobs`")
    return job_id


def parse_list(stdout: str, workdir: str) -> list[JobInfo]:
    """Jobs from ``list_argv``'s (or ``show_argv``'s, ``wait_argv``'s) output, oldest first; of a job
    listed twice (seen ended by two listings at once), its last line."""
    jobs: dict[str, JobInfo] = {}
    seen_at = next((_epoch(line[4:]) for line in stdout.splitlines() if line.startswith("now\t")), None)
    for line in stdout.splitlines():
        cells = line.split("\t")
        if len(cells) == 10:  # a line an older orch wrote to the index: nobody named as the stop's
            cells.append("")
        if len(cells) != 11 or cells[0] != "job":
            continue
        _, job_id, purpose, pid, alive, code, started, ended, size, stop, by = cells
        jobs[job_id] = JobInfo(
            id=job_id,
            purpose=purpose,
            pid=int(pid) if pid.isdigit() else None,
            state=job_state(alive in ("1", "2"), code),
            exit_code=int(code) if code.strip().lstrip("-").isdigit() else None,
            started_at=_epoch(started),
            ended_at=_epoch(ended),
            log_size=int(size) if size.isdigit() else 0,
            stop_requested=stop == "1",
            stopped_by=by.strip() if stop == "1" else "",
            dir=job_dir(workdir, job_id),
            seen_at=seen_at,
            wrapper_gone=alive == "2",
        )
    return sorted(jobs.values(), key=lambda j: (j.started_at or datetime.min.replace(tzinfo=timezone.utc), j.id))


def stop_argv(job_dir: str, grace_seconds: int, by: str = "") -> list[str]:
    return ["sh", "-c", _script(_STOP), "orch-stop", job_dir, str(grace_seconds), _one_line(by)]


def _one_line(text: str) -> str:
    """``text`` as one line of at most 100 characters, without tabs (a cell of the job listing)."""
    return " ".join(text.split())[:100]


# -- operations over a runner ------------------------------------------------------------------


class JobStartError(RemoteCommandError):
    """A job could not be started: nothing runs and nothing of it is left on the host (a full disk, a
    workdir orch cannot write, another orch holding the start lock too long)."""


class JobBusyError(RefusedError):
    """A job was not started (nothing of it is on the host): job ``job_id`` of a purpose its spec excludes
    runs there. The caller says what that job is to its operator."""

    def __init__(self, host: str, spec: JobSpec, busy: Busy) -> None:
        super().__init__(
            f"{host}: job {busy.job_id} runs, and a {spec.purpose} job never runs beside it: nothing was started",
            hint=f"start it once that job has ended (`orch jobs --host {host}`)",
        )
        self.job_id = busy.job_id


def start(runner: Runner, workdir: str, spec: JobSpec, secret_env: Mapping[str, str] | None = None) -> Started:
    """Start ``spec`` detached, or attach to the job already running for its purpose. ``secret_env``
    reaches the job's environment as the host's inventory env does (the runner sends the values on
    stdin): on no command line, and not in the job's ``env`` file or any other part of its record.
    JobStartError (one line, never the start script) when the host could not start it; JobBusyError when
    a job of a purpose it excludes runs there."""
    result = runner.run(start_argv(workdir, new_job_id(spec), spec), env=secret_env, timeout=60)
    if not result.ok:
        message = start_failure(runner.host, workdir, spec.purpose, result.stderr or result.stdout)
        raise JobStartError(message, exit_status=result.exit_status, stderr=result.stderr)
    started = parse_start(result.stdout)
    if isinstance(started, Busy):
        raise JobBusyError(runner.host, spec, started)
    return started


_NO_SPACE = ("No space left on device", "Disk quota exceeded")


def start_failure(host: str, workdir: str, purpose: str, output: str) -> str:
    """Why a job could not be started, in one line: a full disk said as such (dash's ``printf`` reports
    a failed write as "I/O error", most often a full disk), else the start's last line of output."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = f"{host}: could not start the {purpose} job in {workdir}"
    if any(mark in line for line in lines for mark in _NO_SPACE):
        return f"{host}: no space left on device in {workdir}: the {purpose} job could not be written"
    if any("I/O error" in line for line in lines):
        return f"{said}: a write failed (I/O error: is the disk full?)"
    return f"{said}: {lines[-1][:300] if lines else '(no output)'}"


# $1 separator, $2 number of directories N, then N directories to make (mode 0700), then start commands
# (``start_argv``) separated by $1: run one after another, each answered by one `result\t<rc>\t<output>` line.
_START_MANY = r"""
sep=$1; lock=$2; ndirs=$3; shift 3
if [ "$ndirs" -gt 0 ]; then mkdir -p -m 700 -- "${@:1:$ndirs}" || exit 1; shift "$ndirs"; fi
if [ -n "$lock" ]; then
  [ ! -L "$lock" ] || { echo "orch: $lock is a symbolic link; orch does not follow a link it did not make" >&2
    exit 78; }
  exec 8>>"$lock" && flock -w 60 8 || { echo "orch: another orch is starting jobs on this host" >&2; exit 75; }
fi
cmd=()
go() {
  [ ${#cmd[@]} -gt 0 ] || return 0
  out=$("${cmd[@]}" 8>&- 2>&1); rc=$?
  printf 'result\t%s\t%s\n' "$rc" "$(printf '%s' "$out" | tr '\n\t' '  ')"
  cmd=()
}
for a in "$@"; do if [ "$a" = "$sep" ]; then go; else cmd+=("$a"); fi; done
go
"""
_START_SEPARATOR = "--orch-next-job--"
START_MANY_BYTES = 96 * 1024  # a remote command line stays well under Linux's 128 KiB for one argument


def start_many_argv(starts: Sequence[Sequence[str]], dirs: Sequence[str] = (), lock: str = "") -> list[str]:
    """One command: make ``dirs``, then (holding ``lock``, a file's path, when given) run each ``start_argv`` of
    ``starts`` in order."""
    argv = ["bash", "-c", _START_MANY, "orch-start-many", _START_SEPARATOR, lock, str(len(dirs)), *dirs]
    for start_command in starts:
        if _START_SEPARATOR in start_command:
            raise UsageError(f"a job's command holds {_START_SEPARATOR!r}, which frames a batch of starts")
        argv += [*start_command, _START_SEPARATOR]
    return argv


@dataclass(frozen=True)
class StartResult:
    """One start of a batch: what ``start`` would have returned, or why it failed."""

    spec: JobSpec
    started: Started | None
    error: str | None = None


def parse_start_many(stdout: str, specs: Sequence[JobSpec]) -> list[StartResult]:
    """``start_many_argv``'s answer, one result per spec in order; a start the answer does not reach
    (the batch was cut short) is an error."""
    lines = [line.split("\t", 2) for line in stdout.splitlines() if line.startswith("result\t")]
    results = []
    for i, spec in enumerate(specs):
        if i >= len(lines) or len(lines[i]) != 3:
            results.append(StartResult(spec, None, "the batch of starts ended before this job's"))
            continue
        _, rc, out = lines[i]
        if rc != "0":
            results.append(StartResult(spec, None, f"exited {rc}: {out.strip()[:300]}"))
            continue
        try:
            started = parse_start(out)
        except ValueError as exc:
            results.append(StartResult(spec, None, str(exc)))
            continue
        if isinstance(started, Busy):
            results.append(StartResult(spec, None, f"job {started.job_id} of a purpose it excludes runs"))
        else:
            results.append(StartResult(spec, started))
    return results


def start_many(
    runner: Runner, workdir: str, specs: Sequence[JobSpec], dirs: Sequence[str] = (), lock: str = ""
) -> list[StartResult]:
    """Start every spec of one host as ``start`` would (detached, or attached to the job running for its
    purpose), in one remote command (more only when the command would be too long for the host): make
    ``dirs`` first, then the starts one after another. Each start is a value: one that failed does not
    stop the next. A remote command that fails as a whole (``mkdir``) raises ``RemoteCommandError``.
    ``lock``: a file on the host held over the whole batch (flock; not the jobs' own start lock), so two
    orchs' batches for the same purposes never interleave: the second one's starts all attach to the first's
    jobs (tuning plans started at the same moment by two controllers)."""
    batches: list[list[tuple[JobSpec, list[str]]]] = [[]]
    size = 0
    for spec in specs:
        argv = start_argv(workdir, new_job_id(spec), spec)
        length = sum(len(shlex.quote(a)) + 1 for a in argv)
        if batches[-1] and size + length > START_MANY_BYTES:
            batches.append([])
            size = 0
        batches[-1].append((spec, argv))
        size += length
    results: list[StartResult] = []
    for n, batch in enumerate(batches):
        argv = start_many_argv([a for _, a in batch], dirs if n == 0 else (), lock)
        stdout = runner.run(argv, check=True, timeout=60 + 30 * len(batch)).stdout
        results += parse_start_many(stdout, [s for s, _ in batch])
    return results


def list_jobs(runner: Runner, workdir: str) -> list[JobInfo]:
    return parse_list(runner.run(list_argv(workdir), check=True, timeout=60).stdout, workdir)


def show(runner: Runner, workdir: str, job_ids: Sequence[str]) -> list[JobInfo]:
    """Jobs ``job_ids`` as the host sees them now, read from their directories only (a cost that does
    not grow with the host's other jobs); a job the host does not have is left out."""
    if not job_ids:
        return []
    return parse_list(runner.run(show_argv(workdir, job_ids), check=True, timeout=60).stdout, workdir)


def find(runner: Runner, workdir: str, job_id: str) -> JobInfo:
    """Job ``job_id`` as the host sees it now (its directory only: no listing); UsageError when there is none."""
    if not _JOB_ID.match(job_id):
        raise _no_job(runner, workdir, job_id)
    return _one(runner, workdir, job_id, runner.run(show_argv(workdir, [job_id]), check=True, timeout=60).stdout)


def wait(runner: Runner, workdir: str, job_id: str, seconds: float, log_offset: int | None = None,
         settle: float = 0.0) -> JobInfo:  # fmt: skip
    """Job ``job_id`` once it has ended, its log has grown past ``log_offset`` (once ``settle`` seconds
    have passed), or ``seconds`` have passed, whichever is first: one round trip that blocks on the host
    (checking every 0.1 s), so an exit is seen at once while a caller polls once per ``seconds``."""
    return wait_any(runner, workdir, [job_id], seconds, log_offset, settle)[0]


def wait_any(runner: Runner, workdir: str, job_ids: Sequence[str], seconds: float, log_offset: int | None = None,
             settle: float = 0.0) -> list[JobInfo]:  # fmt: skip
    """``wait`` for several jobs of one host: returns when the first of them ends; each job as it is then,
    in the order of ``job_ids``. UsageError naming a job the host does not have (at once: no wait for it)."""
    result = runner.run(wait_argv(workdir, job_ids, seconds, log_offset, settle), check=True, timeout=seconds + 60)
    return [_one(runner, workdir, job_id, result.stdout) for job_id in job_ids]


def _one(runner: Runner, workdir: str, job_id: str, stdout: str) -> JobInfo:
    for job in parse_list(stdout, workdir):
        if job.id == job_id:
            return job
    raise _no_job(runner, workdir, job_id)


def _no_job(runner: Runner, workdir: str, job_id: str) -> UsageError:
    return UsageError(
        f"{runner.host}: no job {job_id!r} in {workdir}/jobs", hint=f"see `orch jobs --host {runner.host}`"
    )


def running(found: Sequence[JobInfo], purpose_prefix: str) -> list[JobInfo]:
    """Of the host's jobs ``found`` (in their order), those still running whose purpose starts with
    ``purpose_prefix`` (``server``, ``bench``, ``tune.``)."""
    return [j for j in found if j.running and j.purpose.startswith(purpose_prefix)]


def latest(jobs: list[JobInfo], purpose_prefix: str = "") -> JobInfo | None:
    matching = [j for j in jobs if j.purpose.startswith(purpose_prefix)]
    return matching[-1] if matching else None


def stop(runner: Runner, job: JobInfo, grace_seconds: int = 30, by: str = "") -> str:
    """SIGTERM the job's process group, SIGKILL after ``grace_seconds``: 'stopped', 'killed', 'ended', or
    'lost' (no exit code and its process is gone: nothing is signalled). The job's process is its
    recorded pid only while that pid has the recorded start time in the recorded boot: after a reboot
    a pid (and start time, counted from boot) can belong to anyone. ``by``: who asks, kept in the job's
    directory before any signal (``JobInfo.stopped_by``): a stop whose record was cut off is still named."""
    result = runner.run(stop_argv(job.dir, grace_seconds, by), check=True, timeout=grace_seconds + 60)
    return result.stdout.strip()


def read_tail(runner: Runner, job: JobInfo, max_bytes: int = 8192) -> str:
    """The end of a job's log as of ``job.log_size``: at most ``max_bytes``, starting at a line boundary
    when it can. Bytes written since the listing are left out, so a follower resuming at
    ``job.log_size`` prints each byte once."""
    size = job.log_size
    start = max(0, size - max_bytes)
    data = runner.read_bytes(job.log, offset=start, length=size - start) if size else b""
    text = data.decode(errors="replace")
    if size > max_bytes and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


def tail_lines(text: str, lines: int) -> str:
    """Last ``lines`` lines of a log, with tqdm's carriage-return redraws collapsed to their last state. The
    newline ending the last line ends it: it does not start an empty line that would count as one."""
    body = text.replace("\r\n", "\n").removesuffix("\n")
    clean = [line.rsplit("\r", 1)[-1] for line in body.split("\n")]
    return "\n".join(clean[-lines:]) if lines > 0 else ""
