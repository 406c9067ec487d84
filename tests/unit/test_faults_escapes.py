"""Issue 13 §8: text a host sends is made inert before it is printed (pure rendering functions)."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest
from rich.console import Console

from orchestrator import render
from orchestrator.ops import report
from orchestrator.render import InertLog, inert, inert_log
from orchestrator.state import HostState, SGLangInfo, State

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://x\x07link"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]8;;http://x\\x07link"


def test_inert_shows_every_terminal_control_as_its_escape_and_keeps_newlines_and_tabs() -> None:
    assert inert(HOSTILE) == SHOWN
    assert inert("a\tb\nc") == "a\tb\nc"
    assert inert("\r\b\x00\x7f") == "\\x0d\\x08\\x00\\x7f"
    assert inert("\x9b2J\x9d0;t\x9c") == "\\x9b2J\\x9d0;t\\x9c"  # one-byte CSI, OSC and ST (C1)
    assert inert("abc\u202edcb") == "abc\\u202edcb"  # a bidi override cannot reorder the line
    assert inert("ümlaut → ok [red]") == "ümlaut → ok [red]"


def test_inert_log_drops_colours_keeps_carriage_returns_and_escapes_the_rest() -> None:
    assert inert_log("\x1b[32mINFO\x1b[0m ready\x1b[1;31m!\x1b[m\n") == "INFO ready!\n"
    assert inert_log("10%\r50%\r\n") == "10%\r50%\r\n"
    assert inert_log(HOSTILE) == SHOWN
    assert inert_log("\x1b[2J\x1b[H\x07") == "\\x1b[2J\\x1b[H\\x07"  # clear-screen is no colour


def test_a_followed_log_drops_a_colour_cut_between_two_pieces_whole() -> None:
    shown = InertLog()
    pieces = ["INFO \x1b[3", "2mready\x1b", "[0m \x1b]0;t\x07", "\x1b["]
    assert [shown.feed(p) for p in pieces] == ["INFO ", "ready", " \\x1b]0;t\\x07", ""]
    assert shown.end() == "\\x1b["  # the log ended inside a sequence: shown, escaped


def test_table_cells_are_plain_text_never_markup_nor_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr(render, "out", Console(file=buffer, width=200, color_system="truecolor", force_terminal=True))
    render.table(f"[bold]title {HOSTILE}", ["host", "job"], [["h", f"[red]x[/red] [link=http://x]y[/link] {HOSTILE}"]])
    text = buffer.getvalue()
    assert "[red]x[/red] [link=http://x]y[/link]" in text and "[bold]title" in text
    assert "\x1b]" not in text and "\x07" not in text  # only the table's own styling (SGR) is there
    assert "pwned" in text


def test_the_report_shows_a_hostile_subject_escaped_in_markdown_and_html() -> None:
    host = HostState(sglang=SGLangInfo(commit="a" * 40, short="aaaaaaa", branch="main", subject=HOSTILE))
    state = State(hosts={"h1": host})
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    markdown = report.render_markdown(report.build(state, "state.json", now))
    page = report.render_html(report.build(state, "state.json", now))
    for text in (markdown, page):
        assert "\x1b" not in text and "\x07" not in text
    assert "pwned" in markdown and "pwned" in page
