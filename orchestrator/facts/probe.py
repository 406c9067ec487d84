"""One remote command that runs several read-only commands: one round trip per host for ``status``.

Each section is a name and an argv; their outputs come back framed by marker lines with the exit
status, and ``parse`` splits them apart again. The argv values travel as positional parameters of a
constant bash script, so nothing in them is ever parsed by a shell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SEPARATOR = "--orch-section--"
_MARK = "@@orch-section"

_SCRIPT = r"""
group=()
flush() {
  [ ${#group[@]} -gt 0 ] || return 0
  printf '%s begin %s\n' "$mark" "${group[0]}"
  "${group[@]:1}" 2>&1
  rc=$?
  printf '\n%s end %s %s\n' "$mark" "${group[0]}" "$rc"
  group=()
}
mark=$1; sep=$2; shift 2
for a in "$@"; do if [ "$a" = "$sep" ]; then flush; else group+=("$a"); fi; done
flush
"""


@dataclass(frozen=True)
class Section:
    exit_status: int
    output: str  # stdout and stderr together

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def probe_argv(sections: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    argv = ["bash", "-c", _SCRIPT, "orch-probe", _MARK, SEPARATOR]
    for name, command in sections:
        if SEPARATOR in command or not name.isidentifier():
            raise ValueError(f"probe section {name!r} cannot be framed")
        argv += [name, *command, SEPARATOR]
    return argv


def parse(stdout: str) -> dict[str, Section]:
    """Sections by name; a section cut short (no end marker) is absent."""
    sections: dict[str, Section] = {}
    current: str | None = None
    lines: list[str] = []
    for line in stdout.split("\n"):
        if line.startswith(f"{_MARK} begin "):
            current, lines = line.split(" ", 2)[2], []
        elif line.startswith(f"{_MARK} end ") and current is not None:
            status = line.rsplit(" ", 1)[1]
            text = "\n".join(lines)
            sections[current] = Section(int(status) if status.lstrip("-").isdigit() else -1, text.removesuffix("\n"))
            current = None
        elif current is not None:
            lines.append(line)
    return sections


TIMED_OUT = (124, 137)  # coreutils ``timeout``: the command ended by SIGTERM, by SIGKILL (``-k``)


def explain_timeouts(sections: dict[str, Section], messages: dict[str, str]) -> dict[str, Section]:
    """``sections`` with the output of each one named in ``messages`` that ``timeout`` ended replaced
    by its message (a hung command prints nothing worth showing)."""
    return {
        name: Section(s.exit_status, messages[name]) if name in messages and s.exit_status in TIMED_OUT else s
        for name, s in sections.items()
    }
