"""Git on the host: argv builders and parsers for the SGLang checkout."""

from __future__ import annotations

from dataclasses import dataclass

# Prints key=value lines about the checkout in $1 relative to the upstream ref $2. Values arrive as
# positional parameters, so no path or ref is ever parsed by the shell.
_INFO_SCRIPT = r"""
cd -- "$1" 2>/dev/null || { echo "error=no such directory: $1"; exit 0; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "error=not a git checkout: $1"; exit 0; }
echo "commit=$(git rev-parse HEAD)"
echo "branch=$(git symbolic-ref --short -q HEAD || echo HEAD)"
echo "subject=$(git log -1 --format=%s)"
echo "upstream_commit=$(git rev-parse -q --verify "$2^{commit}" || echo)"
echo "behind=$(git rev-list --count "HEAD..$2" 2>/dev/null || echo)"
echo "ahead=$(git rev-list --count "$2..HEAD" 2>/dev/null || echo)"
for _op in MERGE_HEAD:merge rebase-merge:rebase rebase-apply:rebase CHERRY_PICK_HEAD:cherry-pick; do
  [ -e "$(git rev-parse --git-path "${_op%%:*}")" ] && { echo "in_progress=${_op#*:}"; break; }
done
reflog_time() { t=$(git log -g -1 --date=unix --format=%gd "$1" -- 2>/dev/null); t=${t##*@?}; echo "${t%?}"; }
fetched=$(stat -c %Y -- "$(git rev-parse --git-path FETCH_HEAD)" 2>/dev/null)
[ -n "$fetched" ] || fetched=$(reflog_time "$2")
[ -n "$fetched" ] || fetched=$(reflog_time "${2%%/*}/HEAD")
echo "fetched=$fetched"
echo "now=$(date +%s)"
"""
# ``fetched`` is when upstream was last fetched, on the host's clock: FETCH_HEAD's mtime (every fetch
# rewrites it, whoever ran it: orch pull, status --fetch, a cron job, the operator), else the last
# update of the upstream ref's reflog, else of the remote's HEAD (a fresh clone: it has no FETCH_HEAD,
# and its remote refs are packed without a reflog). ``now`` is the host's clock too, so the age does
# not depend on the two clocks agreeing.


@dataclass(frozen=True)
class GitInfo:
    commit: str
    branch: str
    subject: str
    upstream_commit: str | None
    behind: int | None
    fetched_age_s: int | None = None  # seconds since upstream was last fetched (None: no fetch recorded)
    ahead: int | None = None  # local commits upstream does not have: with ``behind``, a diverged branch
    in_progress: str | None = None  # "merge", "rebase", "cherry-pick": an operation stopped half-way

    @property
    def lag(self) -> str:
        """Where the checkout stands against upstream, in words: ``up to date``, ``3 behind``, ``diverged
        (2 local, 3 upstream commits)``, ``mid-merge``; ``? behind`` when unknown."""
        return describe_lag(self.behind, self.ahead, self.in_progress)

    @property
    def short(self) -> str:
        return self.commit[:10]


class GitInfoError(Exception):
    pass


def info_argv(sglang_dir: str, upstream: str) -> list[str]:
    return ["sh", "-c", _INFO_SCRIPT, "orch-git-info", sglang_dir, upstream]


def parse_info(stdout: str) -> GitInfo:
    """Parse the output of ``info_argv``; a missing or broken checkout raises ``GitInfoError``."""
    fields = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    if "error" in fields:
        raise GitInfoError(fields["error"])
    if not fields.get("commit"):
        raise GitInfoError(f"unexpected output from git: {stdout.strip()[:200]!r}")
    behind = fields.get("behind", "")
    return GitInfo(
        commit=fields["commit"],
        branch=fields.get("branch", "HEAD"),
        subject=fields.get("subject", ""),
        upstream_commit=fields.get("upstream_commit") or None,
        behind=int(behind) if behind.isdigit() else None,
        fetched_age_s=_age(fields.get("fetched", ""), fields.get("now", "")),
        ahead=int(ahead) if (ahead := fields.get("ahead", "")).isdigit() else None,
        in_progress=fields.get("in_progress") or None,
    )


def describe_lag(behind: int | None, ahead: int | None = None, in_progress: str | None = None) -> str:
    """``GitInfo.lag`` from its parts (the state keeps them as numbers).

    >>> describe_lag(3), describe_lag(3, 2), describe_lag(0, 0, "merge"), describe_lag(None)
    ('3 behind', 'diverged (2 local, 3 upstream commits)', 'mid-merge', '? behind')
    """
    if in_progress:
        return f"mid-{in_progress}"
    if behind is None:
        return "? behind"
    if ahead:
        return f"diverged ({ahead} local, {behind} upstream commits)" if behind else f"{ahead} ahead"
    return "up to date" if behind == 0 else f"{behind} behind"


_GENERIC_FETCH_LINES = (
    "fatal: Could not read from remote repository.",
    "Please make sure you have",
    "and the repository",
)


def fetch_error_line(output: str) -> str:
    """The line of a failed ``git fetch`` that says why: the ssh or HTTP error (``ssh: connect to host ...:
    Connection refused``, ``fatal: unable to access ...: Could not resolve host``), not git's closing
    advice ("... and the repository exists."); the last line when none is better."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(_GENERIC_FETCH_LINES)]
    return (useful or lines or ["no answer"])[0]


def _age(then: str, now: str) -> int | None:
    """Seconds from ``then`` to ``now`` (epoch seconds, both read on the host); never negative."""
    if not (then.strip().isdigit() and now.strip().isdigit()):
        return None
    return max(0, int(now) - int(then))


def git(sglang_dir: str, *args: str) -> list[str]:
    """``git -C DIR ARGS``: every git command orch runs goes through here."""
    return ["git", "-C", sglang_dir, *args]


def dirty_argv(sglang_dir: str) -> list[str]:
    return git(sglang_dir, "status", "--porcelain", "--untracked-files=no")


def fetch_argv(sglang_dir: str, remote: str) -> list[str]:
    return git(sglang_dir, "fetch", "--quiet", "--", remote)


def behind_ahead_argv(sglang_dir: str, upstream: str) -> list[str]:
    """``BEHIND<TAB>AHEAD``: the commits ``upstream`` has that HEAD lacks, and the local ones it lacks
    (``parse_behind_ahead``); fails when ``upstream`` is no commit in the checkout."""
    return git(sglang_dir, "rev-list", "--left-right", "--count", f"{upstream}...HEAD")


def parse_behind_ahead(stdout: str) -> tuple[int, int]:
    behind, ahead = stdout.split()
    return int(behind), int(ahead)


def fast_forward_argv(sglang_dir: str, upstream: str) -> list[str]:
    return git(sglang_dir, "merge", "--ff-only", "--quiet", upstream)


def log_argv(sglang_dir: str, old: str, new: str) -> list[str]:
    return git(sglang_dir, "log", "--format=%h %s", f"{old}..{new}")


PACKAGE_PINS = "python/pyproject.toml"
"""The SGLang package's dependencies and their pins (``sglang-kernel``, ``flashinfer``...): a pull that
changes it needs an install (``pip install -e python``) before the server runs the new code."""


def changed_argv(sglang_dir: str, old: str, new: str, path: str) -> list[str]:
    """The names of the files under ``path`` that differ between ``old`` and ``new`` (one per line)."""
    return git(sglang_dir, "diff", "--name-only", old, new, "--", path)


def parse_dirty(stdout: str) -> list[str]:
    """Paths of tracked files with uncommitted changes, from ``git status --porcelain``."""
    return [line[3:] for line in stdout.splitlines() if len(line) > 3]


def parse_log(stdout: str) -> list[tuple[str, str]]:
    """``(short sha, subject)`` pairs, newest first."""
    pairs = []
    for line in stdout.splitlines():
        sha, _, subject = line.partition(" ")
        if sha:
            pairs.append((sha, subject))
    return pairs
