"""Notifications: events from state transactions, delivered as JSON on a local command's stdin."""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.notify import Event, Notifier, events_between
from orchestrator.state import JobRecord, Phase, State
from orchestrator.store import StateStore

T0 = datetime(2026, 11, 29, 22, 34, tzinfo=timezone.utc)

RECORDER = "import sys, pathlib; pathlib.Path(sys.argv[1]).open('a').write(sys.stdin.read())"


def recorder(out: Path) -> str:
    """A notify command that appends each event it reads to ``out``."""
    return shlex.join([sys.executable, "-c", RECORDER, str(out)])


def a_job(state: str = "running", **changes: object) -> JobRecord:
    fields: dict[str, object] = {"id": "bench-1", "kind": "bench", "purpose": "bench", "argv": ["python"]}
    fields.update(log="/root/.orch/jobs/bench-1/log", state=state, started_at=T0, **changes)
    return JobRecord.model_validate(fields)


def test_phase_change_in_a_transaction_is_one_event() -> None:
    before = State()
    after = before.model_copy(deep=True)
    after.host("gpu-1").set_phase(Phase.PULLED, "abc -> def")
    [event] = events_between(before, after)
    assert (event.kind, event.host, event.from_, event.to, event.reason) == (
        "phase",
        "gpu-1",
        "new",
        "pulled",
        "abc -> def",
    )


def test_job_that_left_running_is_one_event_and_a_still_running_job_is_none() -> None:
    before = State()
    before.host("gpu-1").jobs["bench-1"] = a_job()
    after = before.model_copy(deep=True)
    assert events_between(before, after) == []
    after.host("gpu-1").jobs["bench-1"] = a_job("failed", exit_code=2, ended_at=T0)
    [event] = events_between(before, after)
    assert (event.kind, event.from_, event.to, event.time) == ("job", "running", "failed", T0)
    assert event.job == {"id": "bench-1", "kind": "bench", "purpose": "bench", "exit_code": 2}
    assert event.reason == "bench job bench-1 exited 2"


def test_event_json_has_the_documented_keys() -> None:
    doc = json.loads(Event("phase", "gpu-1", "tuning", "tuned", "done", T0).to_json())
    assert doc == {
        "kind": "phase",
        "host": "gpu-1",
        "from": "tuning",
        "to": "tuned",
        "reason": "done",
        "time": "2026-11-29T22:34:00Z",  # as every JSON document of orch's (docs/commands.md)
    }


def test_store_delivers_each_phase_change_as_json_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    notifier = Notifier(recorder(out))
    store = StateStore(tmp_path / "state.json", on_commit=notifier.on_commit)
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "again: no change, no event"))
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.TUNING, "tuning 2 shapes"))
    notifier.close()  # the command's end: what is queued is delivered
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["host"], e["from"], e["to"], e["reason"]) for e in events] == [
        ("gpu-1", "new", "pulled", "pulled"),
        ("gpu-1", "pulled", "tuning", "tuning 2 shapes"),
    ]
    assert all(e["kind"] == "phase" and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e["time"]) for e in events)


def test_failing_notifier_is_reported_and_the_update_still_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    command = shlex.join([sys.executable, "-c", "import sys; print('slack said no', file=sys.stderr); sys.exit(3)"])
    notifier = Notifier(command)
    store = StateStore(tmp_path / "state.json", on_commit=notifier.on_commit)
    with caplog.at_level(logging.WARNING):
        store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
        notifier.close()
    assert store.read().host("gpu-1").phase == Phase.PULLED
    assert "gpu-1 phase new -> pulled exited 3: slack said no" in caplog.text


def test_hanging_notifier_is_killed_after_its_timeout_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "child-survived"
    script = f"sleep 1 && touch {shlex.quote(str(marker))}"
    notifier = Notifier(shlex.join(["sh", "-c", f"({script}) & sleep 30"]), timeout=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert notifier.send(Event("phase", "gpu-1", "tuned", "launching", "relaunch", T0)) is False
    assert time.monotonic() - started < 3
    assert "timed out after 0.3s (killed)" in caplog.text
    time.sleep(1.5)
    assert not marker.exists()  # the whole process group was killed, the notifier's child too


def test_a_notifier_still_running_does_not_hold_up_the_command_and_is_waited_for_at_its_end(tmp_path: Path) -> None:
    """A transaction commits and returns while its notifier is still running (a relaunch is not held up
    between stopping a server and starting the next); ``close`` waits for what is queued."""
    release, done, out = tmp_path / "release", tmp_path / "done", tmp_path / "events.jsonl"
    script = f"cat >> {out}; until [ -e {release} ]; do sleep 0.05; done; echo >> {done}"
    notifier = Notifier(shlex.join(["sh", "-c", script]), timeout=5)
    store = StateStore(tmp_path / "state.db", on_commit=notifier.on_commit)
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.TUNING, "tuning"))
    assert not done.exists()  # both transactions returned; the first notifier waits for the release
    release.touch()
    notifier.close()
    assert done.read_text() == "\n\n"  # each event in its turn, neither killed
    assert [json.loads(line)["to"] for line in out.read_text().splitlines()] == ["pulled", "tuning"]


def test_at_the_end_a_hung_notifier_is_given_its_timeout_then_killed_and_the_events_left_are_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "child-survived"
    notifier = Notifier(shlex.join(["sh", "-c", f"(sleep 2 && touch {marker}) & sleep 30"]), timeout=1)
    store = StateStore(tmp_path / "state.db", on_commit=notifier.on_commit)
    with caplog.at_level(logging.WARNING):
        store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
        store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.TUNING, "tuning"))
        notifier.close()
        time.sleep(2.5)
    assert re.search(r"did not take the last [12] events? within 1s; not delivered", caplog.text), caplog.text
    assert caplog.text.count("timed out") <= 1  # nothing more is tried once the command has given up
    assert not marker.exists()  # the notifier running when it gave up was killed, its children too


def test_abandoned_the_notifier_running_is_killed_and_what_is_left_is_counted(tmp_path: Path) -> None:
    """Ctrl-C: orch exits at once; the notifier (its own session: the terminal's SIGINT never reaches it) was
    left running."""
    pid_file = tmp_path / "pid"
    notifier = Notifier(shlex.join(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]), timeout=30)
    store = StateStore(tmp_path / "state.db", on_commit=notifier.on_commit)
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.PULLED, "pulled"))
    store.update_host("gpu-1", lambda hs: hs.set_phase(Phase.TUNING, "tuning"))
    while not pid_file.exists() or not pid_file.read_text().strip():
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    assert notifier.abandon() == (2, False)  # neither delivered; the command had not ended
    for _ in range(500):
        try:  # reaped between a look and a read: gone
            if Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):  # ESRCH from the read of a /proc file gone under it
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"notifier {pid} still runs")


def test_missing_notifier_command_is_reported_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert Notifier("/nonexistent/notify --x").send(Event("phase", "h", "new", "pulled", "r", T0)) is False
    assert "could not start" in caplog.text


@pytest.mark.parametrize("command", ["", "   ", "unbalanced 'quote"])
def test_unusable_notify_command_is_a_usage_error(command: str) -> None:
    with pytest.raises(UsageError, match="--notify-cmd"):
        Notifier(command)


@pytest.mark.parametrize(
    ("command", "marker"),
    [
        ("curl -H 'Authorization: Bearer sk-0123456789abcdef0123' https://hooks.example", "Authorization:"),
        ("notify.sh --token=0123456789abcdef", "token="),
        (
            "curl -d @- https://hooks.slack.com/services/T0/B0/0123456789abcdef",
            "a webhook URL (its path is its secret)",
        ),
        ("curl https://hooks.slack.com//workflows/T0/0123456789abcdef", "a webhook URL (its path is its secret)"),
        ("curl https://acme.webhook.office.com/webhookb2/0123456789abcdef", "a webhook URL (its path is its secret)"),
        ("curl https://hooks.zapier.com/hooks/catch/1/0123456789abcdef/", "a webhook URL (its path is its secret)"),
        ("curl https://api.telegram.org/bot1:0123456789abcdef/sendMessage", "a webhook URL (its path is its secret)"),
        ("curl https://discord.gg/api/webhooks/1/0123456789abcdef", "a webhook URL (its path is its secret)"),
        ("curl -uops:0123456789abcdef https://alerts.example", "a USER:PASSWORD for -u/--user"),
        ("curl -U proxy:0123456789abcdef https://alerts.example", "a USER:PASSWORD for -u/--user"),
        ("curl --proxy-user proxy:0123456789abcdef https://alerts.example", "a USER:PASSWORD for -u/--user"),
        ("curl http://:0123456789abcdef@alerts.example/", "a password in a URL (user:password@)"),
        ("curl -H 'Cookie: session=0123456789abcdef' https://alerts.example", "a credential header or key"),
        ('curl -d \'{"routing_key": "0123456789abcdef"}\' https://alerts.example', "a credential header or key"),
        ("curl -u ops:0123456789abcdef https://alerts.example", "a USER:PASSWORD for -u/--user"),
        ("curl --user=ops:0123456789abcdef https://alerts.example", "a USER:PASSWORD for -u/--user"),
        ("curl https://ops:0123456789abcdef@alerts.example/hook", "a password in a URL (user:password@)"),
        ("curl -H 'X-Auth-Token: 0123456789abcdef' https://alerts.example", "a credential header or key"),
        ("curl -H 'X-Refresh-Key: 0123456789abcdef' https://alerts.example", "a credential header or key"),
        ("curl --oauth2-bearer 0123456789abcdef https://alerts.example", "a bearer token"),
        ("python3 /opt/x.py --token 0123456789abcdef", "a token as an option's value (--token VALUE)"),
        ("post.sh --bot-token 0123456789abcdef", "a token as an option's value (--token VALUE)"),
        ("post https://example.com/hook?key=0123456789abcdef", "a key in a URL's query"),
        ("curl https://fn.example.net/api/orch?code=0123456789abcdef", "a key in a URL's query"),
    ],
)
def test_a_notify_command_holding_a_secret_is_refused_without_echoing_it(command: str, marker: str) -> None:
    with pytest.raises(UsageError) as error:
        Notifier(command)
    assert f"--notify-cmd looks like it holds a secret ({marker!r})" in str(error.value)
    assert "0123456789abcdef" not in str(error.value)
    with pytest.raises(UsageError) as unbalanced:
        Notifier(command + " 'cut")
    assert "0123456789abcdef" not in str(unbalanced.value)


@pytest.mark.parametrize(
    "command",
    [
        "python3 -u hook.py",
        "curl -H 'Content-Type: application/json' -d @- https://alerts.example/orch",
        "sh -c 'jq -c \"{sortkey: .time, monkey: .to}\" >> events.log'",
        "curl http://127.0.0.1:9/orch",
        "python3 /opt/orch/webhook_relay.py",  # a script named for what it does: no URL, no secret
        "/etc/orch/hooks.d/notify",
        "curl https://alerts.example/orch?team=gpu&keyword=fleet",
        "notify.py --tokens-file-mode 0600",
    ],
)
def test_a_notify_command_without_a_secret_is_accepted(command: str) -> None:
    assert Notifier(command).argv == shlex.split(command)


def test_a_failed_notifier_stderr_that_holds_a_secret_is_not_repeated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hook = tmp_path / "hook"
    hook.write_text("#!/bin/sh\necho 'POST https://ops:0123456789abcdef@alerts.example failed' >&2\nexit 7\n")
    hook.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        assert Notifier(str(hook)).send(Event("phase", "h", "new", "pulled", "r", T0)) is False
    assert "exited 7: (its stderr looks like it holds a secret: not shown)" in caplog.text
    assert "0123456789abcdef" not in caplog.text
    caplog.clear()
    hook.write_text("#!/bin/sh\necho \"KeyError: 'host'\" >&2\nexit 1\n")  # a notifier's own bug is shown
    with caplog.at_level(logging.WARNING):
        assert Notifier(str(hook)).send(Event("phase", "h", "new", "pulled", "r", T0)) is False
    assert "exited 1: KeyError: 'host'" in caplog.text


def test_the_notify_command_is_checked_before_any_command_even_one_that_never_opens_the_state(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "hosts.yaml").write_text("hosts:\n  a: {address: 127.0.0.1, port: 1}\n")
    for command, says in [("curl -u ops:0123456789abcdef https://x", "holds a secret"), ("", "--notify-cmd is empty")]:
        run = subprocess.run(
            [sys.executable, "-m", "orchestrator", "-i", str(tmp_path / "hosts.yaml"), "--state",
             str(tmp_path / "state.db"), "--notify-cmd", command, "serve", "--dry-run"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert run.returncode == 2 and says in run.stderr and not run.stdout, run.stderr
        assert "0123456789abcdef" not in run.stderr and not (tmp_path / "state.db").exists()
