"""Text made safe and short for people: what a host sent, shown inert (``inert``, ``inert_log``,
``InertLog``), and spans of time and memory in a few characters. Pure functions with no output of their
own, so rendering (``render``, ``views``) and the written report (``ops.report``) share them; and the
two rules about environment variable names that the transport (what it sends) and the inventory (what
it accepts) must agree on: which names are valid (``is_env_name``) and which say their value is a
secret (``looks_secret``). What looks like a secret in a value (``find_secret``) is refused by the
inventory, the recipes, the state's validators and the operations that start jobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

# Characters that drive a terminal rather than print: C0 controls (ESC, BEL, CR, backspace, ...) but
# newline and tab, DEL, C1 controls (the one-byte CSI 0x9b, OSC 0x9d, ...), and the bidirectional
# overrides and isolates that reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# A colour or text style (SGR, ``ESC [ ... m``): harmless, common in logs, so a log drops it unseen.
_SGR = re.compile("\x1b\\[[0-9;:]*m")
# As ``_CONTROL``, but a log keeps its carriage returns: tqdm redraws its progress bars with them.
_LOG_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """Host-supplied text made safe to print: every character that would drive the terminal (an OSC
    title or link, clear-screen, a colour, a bell, a carriage return) is shown as its escape (``\\x1b``,
    ``\\x07``), so the operator sees what the host sent and the terminal does nothing. Newlines and tabs
    stay. ``--json`` needs none of this: JSON escapes control characters itself."""
    return _CONTROL.sub(_visible, text)


def inert_log(text: str) -> str:
    """A job log's text made safe to print: colours (SGR sequences, as SGLang's and pip's logs carry)
    are dropped, carriage returns (tqdm's progress bars), newlines and tabs stay, and every other
    control character (an OSC title or link, clear-screen, cursor moves, a bell) is shown as its escape,
    as ``inert`` does."""
    return _LOG_CONTROL.sub(_visible, _SGR.sub("", text))


_PARTIAL_SGR = re.compile("\x1b(\\[[0-9;:]*)?\\Z")


class InertLog:
    """``inert_log`` for a log that arrives in pieces (``logs -f``): a colour sequence cut by a piece's
    end is held back until the next piece completes it, so it is dropped whole, never half shown."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        cut = _PARTIAL_SGR.search(text)
        self._held = text[cut.start() :] if cut else ""
        return inert_log(text[: cut.start()] if cut else text)

    def end(self) -> str:
        """What is still held back (the log ended inside a sequence), shown escaped."""
        held, self._held = self._held, ""
        return inert_log(held)


def fmt_mib(mib: int) -> str:
    return f"{mib / 1024:.0f}G" if mib >= 1024 else f"{mib}M"


def fmt_seconds(seconds: float) -> str:
    """A span of time to the second: ``12s``, ``4m12s``, ``1h02m``."""
    whole = max(0, int(seconds))
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def minutes_seconds(seconds: float) -> str:
    """A span of time to the second, for a sentence (an ETA, a wait against its timeout): ``5 s``,
    ``2 min``, ``2 min 5 s``; a zero part is left out, so a round timeout reads ``60 min``.
    ``fmt_seconds`` is the compact form, for tables."""
    minutes, rest = divmod(max(0, int(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes and rest else f"{minutes} min" if minutes else f"{rest} s"


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CRED|AUTH|COOKIE|SESSION", re.IGNORECASE)


def is_env_name(name: str) -> bool:
    """Whether ``name`` is a valid environment variable name (a shell assignment's left side)."""
    return bool(_ENV_NAME.match(name))


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret (HF_TOKEN, OPENAI_API_KEY, ...)."""
    return bool(_SECRET_NAME.search(name))


_SECRET_PATTERN = re.compile(
    r"(?P<marker>token=|hf[_-]token|passw(?:or)?d|api[_-]?key|secret|authorization:|-----BEGIN)"
    r"|(?P<hf_token>\bhf_[A-Za-z0-9]{30,})",
    re.IGNORECASE,
)
"""What looks like a secret: ``TOKEN=``/``HF_TOKEN=`` assignments, ``--hf-token``, ``password``,
``api_key``/``--api-key``, ``secret``, HTTP ``Authorization:`` headers, PEM blocks (``-----BEGIN``) and
Hugging Face tokens (``hf_`` + 30 or more characters). Deliberately crude and case-insensitive: a false
positive is a clear error that is easy to work around (pass the secret through the host's environment),
a false negative is a secret on disk."""


def find_secret(value: Any) -> str | None:
    """What looks like a secret in ``value`` (a string, or lists/dicts of them, keys included), else None.

    Keys count because ``{"password": "..."}`` holds a secret whatever its value looks like. The marker,
    not the value, is returned so that error messages never repeat the secret. Lists and dicts are
    searched as their JSON text, in one pass (JSON's quotes and commas keep two strings from forming a
    marker together)."""
    if isinstance(value, (dict, list, tuple)):
        try:
            value = json.dumps(value, default=str)
        except (TypeError, ValueError):  # keys JSON cannot hold: walk them one by one
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            return _first_secret(items)
    if isinstance(value, str):
        match = _SECRET_PATTERN.search(value)
        return None if match is None else match.group("marker") or "a Hugging Face token (hf_...)"
    return None


def _first_secret(values: Iterable[Any]) -> str | None:
    return next((found for found in map(find_secret, values) if found), None)


def fmt_ranges(numbers: list[int]) -> str:
    """``0-7``, ``0,2,4-6``: a sorted set of numbers with runs collapsed, each value once."""
    parts: list[str] = []
    ordered = sorted(set(numbers))
    start = prev = ordered[0] if ordered else 0
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts) if ordered else ""
