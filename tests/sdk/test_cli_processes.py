"""``acp-server prompt`` and ``acp-server tasks`` as a person meets them: subprocesses
against a served instance, in a terminal (a pty) and without one (pipes)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ServeProcess
from tests.sdk.harness import closed_port_url
from tests.terminal import Terminal, piped

RANK = {"queued": 0, "loading": 1, "running": 2, "cancelling": 3, "succeeded": 4,
        "failed": 4, "cancelled": 4}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ServeProcess(tmp_path_factory.mktemp("cli")) as child:
        yield child.base_url


# -- acp-server prompt on a permission ----------------------------------------------------
def test_without_a_terminal_a_permission_is_rejected_by_default_and_said(url: str) -> None:
    done = piped("prompt", "/permission may I", "--url", url, "--thread")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Permission rejected (reject_once).")
    assert done.stderr == ("acp-server prompt: permission asked: Reference permission check "
                           "(other: the agent did not say what kind of tool this is): answered "
                           "reject_once (--permissions reject; --permissions allow allows)\n")


@pytest.mark.parametrize(("policy", "reply"), [
    ("allow", "Permission allowed (allow_once)."), ("reject", "Permission rejected (reject_once).")])
def test_without_a_terminal_permissions_follows_the_flag(url: str, policy: str, reply: str) -> None:
    done = piped("prompt", "/permission may I", "--url", url, "--thread", "--permissions", policy)
    assert done.returncode == 0 and done.stdout.startswith(reply), done.stderr
    assert f"answered {reply.split('(')[1][:-2]} (--permissions {policy}" in done.stderr


def test_without_a_terminal_cancel_answers_cancelled(url: str) -> None:
    done = piped("prompt", "/permission may I", "--url", url, "--thread", "--permissions", "cancel")
    assert "answered cancelled (--permissions cancel)" in done.stderr
    assert "Permission allowed" not in done.stdout and "Permission rejected" not in done.stdout


def test_in_a_terminal_the_person_chooses(url: str) -> None:
    with Terminal("prompt", "/permission may I", "--url", url, "--thread") as term:
        term.expect(r"The agent asks permission: Reference permission check")
        term.expect(r"2\) \S.*\[allow_always\]")
        term.expect(r"Choose 1-3 \(Enter: reject_once\): ")
        term.send("7\n")                      # not a choice: asked again
        term.expect(r"Not a choice: '7'\. Choose 1-3: ")
        term.send("2\n")
        assert term.finish() == 0
    assert "Permission allowed (allow_always)." in term.text
    assert "Echo: may I" in term.text


def test_in_a_terminal_enter_takes_the_safe_answer(url: str) -> None:
    with Terminal("prompt", "/permission may I", "--url", url, "--thread") as term:
        term.expect(r"Choose 1-3 \(Enter: reject_once\): ")
        term.send("\n")
        assert term.finish() == 0
    assert "Permission rejected (reject_once)." in term.text


# -- acp-server tasks ------------------------------------------------------------------------
def _statuses(stderr: str, task_id: str) -> list[str]:
    return [line.split("  ")[1] for line in stderr.splitlines() if line.startswith(task_id)]


def test_tasks_create_watch_piped_prints_the_text_and_each_status_once(url: str) -> None:
    done = piped("tasks", "create", "/sleep 300ms /chunks 5 hello there from a task", "--watch",
                 "--url", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Echo: hello there from a task\n"
    task_id = done.stderr.split()[0]
    statuses = _statuses(done.stderr, task_id)
    assert statuses[-1] == "succeeded" and statuses.count("succeeded") == 1
    assert [RANK[s] for s in statuses] == sorted(RANK[s] for s in statuses)
    assert len(statuses) == len(set(statuses))
    assert re.fullmatch(rf"{task_id}  succeeded  \d+\.\ds  \d+ tokens",
                        done.stderr.splitlines()[-1])


def test_tasks_create_watch_in_a_terminal(url: str) -> None:
    with Terminal("tasks", "create", "/chunks 4 shown in a terminal", "--watch",
                  "--url", url) as term:
        assert term.finish() == 0
    assert "Echo: shown in a terminal" in term.text
    assert len(re.findall(r"task_\w+  succeeded  ", term.text)) == 1


def test_tasks_list(url: str) -> None:
    made = piped("tasks", "create", "listed task input", "--url", url)
    task_id = made.stdout.split('"id": "')[1].split('"')[0]
    done = piped("tasks", "list", "--url", url)
    assert done.returncode == 0
    [line] = [line for line in done.stdout.splitlines() if line.startswith(task_id)]
    assert line.endswith("listed task input")


# -- an unreachable server --------------------------------------------------------------------
@pytest.mark.parametrize("command", [["prompt", "hi"], ["tasks", "list"],
                                     ["tasks", "create", "hi", "--watch"]])
def test_an_unreachable_server_is_one_line(command: list[str], tmp_path: Path) -> None:
    target = closed_port_url()
    done = piped(*command, "--url", target)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"acp-server {command[0]}: cannot reach {target}: connection refused\n"
