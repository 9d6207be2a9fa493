"""The ``acp-server serve`` command: flag validation (exit 2 with the message) and one
real run as a subprocess (listening line, a request, SIGTERM → exit 0)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from acp_server.cli import build_parser, main
from acp_server.serve_cli import settings_from_args
from acp_server.settings import TOKEN_ENV
from tests.harness import ServeProcess
from tests.http.test_http2 import make_certificates, needs_openssl

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@pytest.mark.parametrize(("flags", "message"), [
    (["--port", "abc"], "Invalid port: 'abc'"),
    (["--port", "-1"], "Invalid port: -1"),
    (["--port", "70000"], "Invalid port: 70000"),
    (["--port", "1.5"], "Invalid port: '1.5'"),
    (["--max-sessions", "-1"], "Invalid max_sessions: -1. Must be a non-negative integer"),
    (["--max-sessions", "1.5"], "Invalid max_sessions: 1.5"),
    (["--max-sessions", "abc"], "Invalid max_sessions: 'abc'"),
    (["--max-pending-prompts-per-session", "-1"],
     "Invalid max_pending_prompts_per_session: -1. Must be a non-negative integer "
     "(0 / inf = unlimited)."),
    (["--max-pending-prompts-per-session", "1.5"], "Invalid max_pending_prompts_per_session: 1.5"),
    (["--max-pending-prompts-per-session", "nan"], "Invalid max_pending_prompts_per_session: nan"),
    (["--session-reap-interval-ms", "-5"], "Invalid session_reap_interval_ms: -5"),
    (["--permission-response-timeout-ms", "2.5"], "Invalid permission_response_timeout_ms: 2.5"),
    (["--initialize-timeout-ms", "0"], "Invalid initialize_timeout_ms: 0"),
    (["--abandoned-turn-timeout-ms", "0"], "Invalid abandoned_turn_timeout_ms: 0. Must be a "
                                           "positive integer (milliseconds)."),
    (["--abandoned-turn-timeout-ms", "1.5"], "Invalid abandoned_turn_timeout_ms: 1.5"),
    (["--max-acp-connections", "0"], "Invalid max_acp_connections: 0"),
    (["--max-acp-connections", "1.5"], "Invalid max_acp_connections: 1.5"),
    (["--store", "mysql://x"], "Invalid store: 'mysql://x'"),
    (["--store", "/plain/path.db"], "Invalid store: '/plain/path.db'"),
    (["--max-running-tasks", "-1"], "Invalid max-running-tasks: -1"),
    # the query string was appended to (/v1?key=…/models) and logged by httpx, key and all
    (["--model-server", "http://127.0.0.1:9/v1?api_key=s3cret"],
     "Invalid model server: 'http://127.0.0.1:9/v1?api_key=***'. Must have no query string"),
    (["--model-server", "http://127.0.0.1:9/v1#frag"], "Invalid model server: "),
    (["--max-pending-prompts-per-session", "five"], "Invalid max_pending_prompts_per_session: 'five'"),
    (["--prompt-deadline-ms", "0"], "Invalid prompt_deadline_ms: 0. Must be a positive integer"),
    (["--prompt-deadline-ms", "-5"], "Invalid prompt_deadline_ms: -5"),
    (["--prompt-deadline-ms", "2.5"], "Invalid prompt_deadline_ms: 2.5"),
    (["--prompt-deadline-ms", "99999999999"], "Invalid prompt_deadline_ms: 99999999999"),
    (["--event-ring-size", "0"], "Invalid event_ring_size: 0. Must be a positive integer in [1, 1000000]."),
    (["--event-ring-size", "1000001"], "Invalid event_ring_size: 1000001"),
    (["--event-ring-size", "x"], "Invalid event_ring_size: 'x'"),
    (["--session-idle-timeout-ms", "-1"], "Invalid session_idle_timeout_ms: -1. Must be a non-negative"),
    (["--session-idle-timeout-ms", "soon"], "Invalid session_idle_timeout_ms: 'soon'"),
    (["--workspace", "/definitely/not/here"], "Invalid workspace: '/definitely/not/here'"),
    (["--hostname", "0.0.0.0"], "Refusing to bind 0.0.0.0 (not a loopback address) without a token"),
    (["--hostname", ""], "Invalid hostname"),
    (["--require-auth"], "--require-auth needs a token"),
    (["--allow-origin", "*"], "'*' is only allowed when a token is configured"),
    (["--allow-origin", "not an origin"], "Invalid allow-origin: 'not an origin'"),
    (["--agent", ""], "Invalid agent: ''"),
    (["--agent", "'unterminated"], "Invalid agent"),
    (["--tls-cert", "/etc/hostname"], "--tls-cert and --tls-key go together"),
    (["--tls-cert", "/nope.pem", "--tls-key", "/nope.pem"], "Invalid tls-cert: '/nope.pem'"),
    (["--tls-cert", "/tmp", "--tls-key", "/tmp"], "Invalid tls-cert: '/tmp'. Must be a readable PEM"),
    # a readable file that is no PEM: one line, exit 2 (it was a traceback once the store opened)
    (["--tls-cert", "/etc/hostname", "--tls-key", "/etc/hostname"],
     "Invalid tls-cert / tls-key: TLS cannot load '/etc/hostname' with '/etc/hostname': "
     "'/etc/hostname' holds no PEM certificate."),
    (["--tls-client-ca", "/etc/hostname"], "--tls-client-ca needs --tls-cert and --tls-key"),
    (["--fleet-ca", "/nope.pem"], "Invalid fleet-ca: '/nope.pem'. Must be a readable PEM file."),
    (["--fleet-ca", "/etc/hostname"], "Invalid fleet-ca: '/etc/hostname': TLS cannot load it "
                                      "(no certificate or crl found). Pass a file of PEM CA "
                                      "certificates."),
    (["--hostname", "0.0.0.0", "--token", "t", "--require-tls"],
     "Refusing to bind 0.0.0.0 (not a loopback address) without TLS"),
    (["--max-headers", "0"], "Invalid max-headers: 0"),
    (["--max-header-bytes", "lots"], "Invalid max-header-bytes: 'lots'"),
    (["--max-request-line-bytes", "-1"], "Invalid max-request-line-bytes: -1"),
    (["--allow-host", "a:b:c"], "Invalid allow-host: 'a:b:c'"),
    (["--allow-host", "http://x"], "Invalid allow-host: 'http://x'"),
    (["--http-server", "nope"], "invalid choice: 'nope'"),
    (["--http-server", "hypercorn"], "invalid choice: 'hypercorn'"),   # never served it
    (["--allow-origin", "http://a.example\n"], "Invalid allow-origin"),
    # a state folder that cannot be made: one line, exit 2 (it was a traceback)
    (["--state-dir", "/proc/no-such-folder"], "Invalid state-dir: '/proc/no-such-folder': "
                                              "cannot create it (No such file or directory)"),
    (["--state-dir", "/etc/hostname"], "Invalid state-dir: '/etc/hostname'"),
    (["--state-dir", "/etc/hostname/x"], "cannot create it (Not a directory)"),
])
def test_invalid_flag_exits_2(flags: list[str], message: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    # a value wrongly accepted starts a server: its state folder is the test's, not ~'s
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    argv = ["serve", *flags] if "--workspace" in flags \
        else ["serve", "--workspace", str(tmp_path), *flags]
    if "--port" not in flags:
        argv += ["--port", "0"]   # the state-dir cases bind first: not 4170, a user's server may hold it
    with pytest.raises(SystemExit) as exc_info:
        main(argv)
    assert exc_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_a_refused_value_is_one_line_not_the_usage(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's own error() prints serve's ~50-line usage first, burying the reason
    with pytest.raises(SystemExit) as exc_info:
        main(["serve", "--workspace", str(tmp_path), "--hostname", "0.0.0.0"])
    assert exc_info.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("acp-server serve: error: Refusing to bind 0.0.0.0"), line


@needs_openssl
def test_tls_files_that_tls_cannot_load_are_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key of another certificate, the files swapped, an encrypted key (no passphrase
    is asked: OpenSSL would prompt on the terminal), a client CA that is no PEM: each is
    the reason in one line, exit 2, before anything starts; the right pair is served."""
    certs = {name: str(path) for name, path in make_certificates(tmp_path).items()}
    encrypted = str(tmp_path / "encrypted-key.pem")
    subprocess.run(["openssl", "pkey", "-in", certs["server-key"], "-aes256", "-passout",
                    "pass:secret", "-out", encrypted], check=True, capture_output=True)
    cases = [
        ([certs["server"], certs["client-key"]], "the key is another certificate's"),
        ([certs["server-key"], certs["server"]], f"{certs['server-key']!r} holds no PEM certificate"),
        ([certs["server"], certs["ca"]], f"{certs['ca']!r} holds no PEM private key"),
        ([certs["server"], encrypted], f"{encrypted!r} is encrypted (no passphrase is asked"),
    ]
    for (cert, key), reason in cases:
        with pytest.raises(SystemExit) as exc_info:
            main(["serve", "--workspace", str(tmp_path), "--tls-cert", cert, "--tls-key", key])
        assert exc_info.value.code == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("acp-server serve: error: Invalid tls-cert / tls-key: "), line
        assert reason in line, line
    with pytest.raises(SystemExit) as exc_info:
        main(["serve", "--workspace", str(tmp_path), "--tls-cert", certs["server"],
              "--tls-key", certs["server-key"], "--tls-client-ca", "/etc/hostname"])
    assert exc_info.value.code == 2
    assert capsys.readouterr().err == ("acp-server serve: error: Invalid tls-client-ca: "
                                       "'/etc/hostname': TLS cannot load it (no certificate or "
                                       "crl found). Pass a file of PEM CA certificates.\n")
    with ServeProcess(tmp_path, "--tls-cert", certs["server"], "--tls-key", certs["server-key"],
                      "--tls-client-ca", certs["ca"]) as child:
        assert child.listening.startswith("acp-server listening on https://127.0.0.1:")
        assert child.stop(timeout=10) == 0


def _settings(*flags: str):  # type: ignore[no-untyped-def]
    parser, _ = build_parser()
    return settings_from_args(parser.parse_args(["serve", *flags]))


# What each subcommand's parser may not import: the server's stack stays out of the
# commands an editor or a script runs (``acp_server.cli``).
SERVER_STACK = ("acp_server.app", "acp_server.server", "acp_server.serve_cli", "granian",
                "uvicorn")
NOT_IMPORTED = {
    None: SERVER_STACK + ("acp_server.connect", "acp_server.store", "acp_server.conformance",
                          "acp_server.client.daemon", "httpx"),
    "connect": SERVER_STACK + ("acp_server.store", "acp_server.conformance", "bridge"),
    "prompt": SERVER_STACK + ("acp_server.store", "acp_server.connect", "bridge"),
    "tasks": SERVER_STACK + ("acp_server.store", "acp_server.connect", "bridge"),
    "token": SERVER_STACK + ("acp_server.connect", "acp_server.conformance"),
    "conformance": SERVER_STACK + ("acp_server.store", "acp_server.connect"),
}


@pytest.mark.parametrize("command", list(NOT_IMPORTED), ids=str)
def test_a_subcommand_imports_only_its_own_module(command: str | None) -> None:
    """``acp-server --help`` (``None``) and each client command's ``--help``, in a fresh
    interpreter: the modules its parser loaded hold none of another command's stack
    (what the command imports as it runs is its own module's business)."""
    argv = ["--help"] if command is None else [command, "--help"]
    code = ("import sys\nfrom acp_server.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\nprint(' '.join(sorted(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=120)
    assert "usage: acp-server" in done.stdout, done.stdout + done.stderr
    loaded = set(done.stderr.split())
    assert [m for m in NOT_IMPORTED[command] if m in loaded] == []


def test_valid_flags(tmp_path: Path) -> None:
    settings = _settings("--workspace", str(tmp_path), "--port", "0",
                         "--max-pending-prompts-per-session", "inf", "--max-sessions", "0",
                         "--prompt-deadline-ms", "60000", "--event-ring-size", "3",
                         "--session-idle-timeout-ms", "0", "--abandoned-turn-timeout-ms", "1500",
                         "--allow-origin", "http://a.example",
                         "--agent", "python -m some.agent --flag")
    assert settings.port == 0
    assert settings.workspace == os.path.realpath(tmp_path)
    assert settings.options.max_pending_prompts_per_session == math.inf
    assert settings.options.pending_prompt_limit is None
    assert settings.options.session_limit is None
    assert settings.options.prompt_deadline_ms == 60000
    assert settings.options.event_ring_size == 3
    assert settings.options.abandoned_turn_timeout_ms == 1500
    assert settings.allow_origins == ("http://a.example",)
    assert settings.agent_argv == ["python", "-m", "some.agent", "--flag"]
    defaults = _settings("--workspace", str(tmp_path))
    assert (defaults.hostname, defaults.port, defaults.agent) == ("127.0.0.1", 4170, "reference")
    assert defaults.options.pending_prompt_limit == 5


def test_session_journal_fsync(tmp_path: Path) -> None:
    assert _settings("--workspace", str(tmp_path)).session_journal_fsync is False
    assert _settings("--workspace", str(tmp_path),
                     "--session-journal-fsync").session_journal_fsync is True


def test_no_web(tmp_path: Path) -> None:
    assert _settings("--workspace", str(tmp_path)).web is True
    assert _settings("--workspace", str(tmp_path), "--no-web").web is False


def test_token_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, " from-env ")
    settings = _settings("--workspace", str(tmp_path), "--hostname", "0.0.0.0")
    assert settings.token == "from-env"
    assert settings.health_needs_auth  # not a loopback bind
    assert _settings("--workspace", str(tmp_path), "--token", "flag").token == "flag"


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_real_run(tmp_path: Path, server: str) -> None:
    with ServeProcess(tmp_path, "--http-server", server, cwd=tmp_path) as child:
        _talk_then_terminate(child, tmp_path, state=str(tmp_path / "state"))


def test_the_default_state_folder_is_the_workspaces_own_and_start_up_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workspaces, two folders under $XDG_STATE_HOME/acp-server/workspaces; the same
    workspace (by any spelling of its path) always the same one; --state-dir wins."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (tmp_path / "link").symlink_to(one)
    first = _settings("--workspace", str(one)).state_dir
    assert Path(first).parent == tmp_path / "xdg" / "acp-server" / "workspaces"
    assert Path(first).name.startswith("one-")
    assert _settings("--workspace", str(tmp_path / "link")).state_dir == first
    assert _settings("--workspace", str(one) + "/.").state_dir == first
    assert _settings("--workspace", str(two)).state_dir not in (first, "")
    assert _settings("--workspace", str(two)).store_url.startswith(
        "sqlite:///" + str(tmp_path / "xdg" / "acp-server" / "workspaces" / "two-"))
    chosen = _settings("--workspace", str(one), "--state-dir", str(tmp_path / "mine")).state_dir
    assert chosen == str(tmp_path / "mine")

    with ServeProcess(one, state_dir=None, cwd=tmp_path,
                      env={"XDG_STATE_HOME": str(tmp_path / "xdg")}) as child:
        _talk_then_terminate(child, one, state=first)
    assert (Path(first) / "lmsp.sqlite3").exists()


def _talk_then_terminate(child: ServeProcess, tmp_path: Path, *, state: str) -> None:
    """The two start-up lines as printed, one turn, then SIGTERM drains: exit 0."""
    match = re.fullmatch(
        r"acp-server listening on (http://127\.0\.0\.1:(\d+)) \(workspace=(.*), agent=reference\)\n",
        child.listening)
    assert match, child.listening
    base_url, port, workspace = match.group(1), int(match.group(2)), match.group(3)
    assert port != 0
    assert workspace == os.path.realpath(tmp_path)
    assert child.state_line == f"state in {state} (--state-dir chooses another)\n"
    # hang bounds, not durations to beat: a loaded machine may not run the child for seconds
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert client.get("/health").json() == {"status": "ok"}
        sid = client.post("/session", json={}).json()["sessionId"]
        response = client.post(f"/session/{sid}/prompt",
                               json={"prompt": [{"type": "text", "text": "/sleep 60s held"}]})
        assert response.status_code == 202
    assert child.stop(timeout=30) == 0   # SIGTERM drains, exit 0 (past 30 s: SIGKILL)


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A second real process on the port of a running one: one line naming the
    address, exit status 2, nothing started (#21 item 12)."""
    second = tmp_path / "second"
    second.mkdir()
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with ServeProcess(tmp_path) as first:
        result = subprocess.run(
            [sys.executable, "-m", "acp_server", "serve", "--port", str(first.port),
             "--workspace", str(second), "--state-dir", str(second / "state")],
            capture_output=True, text=True, env=env, timeout=30)
        assert first.http.get("/health").status_code == 200   # the first one is untouched
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (f"acp-server: cannot listen on 127.0.0.1:{first.port}: "
                             "address already in use (another server has the port: stop "
                             "it, or pass --port with another one, or 0 for any free one)\n")
    assert not (second / "state").exists()   # nothing was started: no store, no record


def _second_serve(workspace: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "acp_server", "serve", "--port", "0",
                           "--workspace", str(workspace), *flags],
                          capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.parametrize(("store", "what"), [
    ("missing/dir/x.db", "does not exist (create it)"),
    ("file/x.db", "is not a folder"),
])
def test_a_sqlite_store_in_a_folder_that_is_not_there_is_one_line_and_exit_2(
        tmp_path: Path, store: str, what: str) -> None:
    """``--store sqlite:///no/such/dir/x.db`` (a typo) logged "cannot start: … No such
    file or directory …; answering 503 and trying again in 10 s" for ever, a config
    error dressed as an outage. It is refused before anything starts: one line, exit 2,
    no state folder made. (A store that fails once started is still waited out:
    tests/store/test_outage_processes.py.)"""
    (tmp_path / "file").write_text("")
    state = tmp_path / "state"
    url = f"sqlite:///{tmp_path / store}"
    result = _second_serve(tmp_path, "--state-dir", str(state), "--store", url)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    folder = (tmp_path / store).parent
    assert result.stderr == (
        f"acp-server serve: error: Invalid store: {url!r}: its folder {folder} {what}. "
        "Pass --store with a file in an existing folder, or none for lmsp.sqlite3 in the "
        "state folder.\n")
    assert not state.exists()   # nothing was started


def test_a_sqlite_store_in_a_folder_that_is_there_is_served(tmp_path: Path) -> None:
    """The check is of the folder only: a new file in an existing folder is made."""
    (tmp_path / "db").mkdir()
    with ServeProcess(tmp_path, "--store", f"sqlite:///{tmp_path / 'db' / 'x.db'}") as child:
        assert child.http.get("/health").json() == {"status": "ok"}
    assert (tmp_path / "db" / "x.db").exists()


def test_a_second_server_on_the_same_sqlite_store_is_one_line_and_exit_2(
        tmp_path: Path) -> None:
    """A second ``serve`` of the same workspace (another port, the same state folder) or
    of the same ``--store sqlite:///…``: it restored the first's sessions from the
    journal, failed the prompt the first was running (``server_restarted``) and wrote
    the same event ids beside it. It is refused before anything starts: one line naming
    the store and the first's pid, exit 2; the first goes on untouched, and once it
    has stopped the store is free again."""
    state = tmp_path / "state"
    db = state / "lmsp.sqlite3"
    with ServeProcess(tmp_path) as first:
        sid = first.http.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        held = first.http.post(f"/session/{sid}/prompt", json={
            "prompt": [{"type": "text", "text": "/sleep 60s held"}]})
        assert held.status_code == 202
        pid = first.process.pid if first.process is not None else 0
        again = _second_serve(tmp_path, "--state-dir", str(state))
        other = tmp_path / "other"
        by_url = _second_serve(tmp_path, "--state-dir", str(other), "--store", f"sqlite:///{db}")
        for result in (again, by_url):
            assert result.returncode == 2, result.stderr
            assert result.stdout == ""
            assert result.stderr == (
                f"acp-server: the store {db} is in use by another acp-server serve (pid "
                f"{pid}): stop it, or give this server its own --state-dir\n")
        status = first.http.get(f"/session/{sid}/status").json()
        assert status["hasActivePrompt"] is True and status["lastEventId"] == 1
        assert first.http.get("/health").json() == {"status": "ok"}
    with ServeProcess(tmp_path) as after:
        assert after.http.get(f"/session/{sid}/status").status_code == 200


def test_an_agent_whose_program_is_not_found_is_named_at_start_up(tmp_path: Path) -> None:
    """``--agent "qwen --acp"`` before qwen is installed: the server starts (it may be
    installed while it runs) but says so at once, one line per agent, instead of leaving
    the first request to find out; the reference agent and a program that is there are
    not named."""
    script = tmp_path / "here.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    with ServeProcess(tmp_path, "--agent", "no-such-agent-xyz --acp", "--agent",
                      "local=./not-here.sh", "--agent", f"here={script}", "--agent",
                      "sh=sh -c true") as child:
        made = child.http.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 503 and made.json()["code"] == "agent_unavailable"
        warned = [line.split("WARNING acp_server: ", 1)[1] for line in
                  child.stderr_text().splitlines() if "is not found" in line]
    assert warned == [
        "agent 'no-such-agent-xyz': 'no-such-agent-xyz' is not found (not on PATH, or not an "
        "executable file): its sessions answer 503 agent_unavailable until it is installed",
        "agent 'local': './not-here.sh' is not found (not on PATH, or not an executable "
        "file): its sessions answer 503 agent_unavailable until it is installed"]


@pytest.mark.parametrize(("where", "message"), [
    # it made a state folder (and a store) for the folder that does not exist, and
    # listed no token: a token made there is one no server ever sees
    (["--workspace", "/definitely/not/here"],
     "acp-server: Invalid workspace: '/definitely/not/here'. Must be an existing directory.\n"),
    # it was a traceback (FileNotFoundError)
    (["--state-dir", "/proc/no-such-folder"],
     "acp-server: Invalid state-dir: '/proc/no-such-folder': cannot create it (No such file "
     "or directory). Pass --state-dir with a folder this user may create or write.\n"),
    # it said "The task store is unavailable: mysql://x: SQLite: [Errno 2] …", exit 1
    (["--store", "mysql://x"],
     "acp-server: Invalid store: 'mysql://x'. Must be sqlite:///PATH or postgresql://….\n"),
])
@pytest.mark.parametrize("command", [["token", "list"], ["token", "create", "ci"], ["audit"]])
def test_the_store_commands_refuse_a_folder_they_cannot_use_in_one_line(
        command: list[str], where: list[str], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert main([*command, *where]) == 2
    assert capsys.readouterr().err == message
    assert not (tmp_path / "xdg").exists()   # nothing was made


def test_the_first_stored_token_says_that_loopback_now_needs_a_credential(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``token create ci`` for a CI bot, beside a server in trusted loopback mode: from
    then on that server answers 401 to the console and to ``acp-server prompt`` without a
    token too (security.md). The first token of a store says so; the next do not."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    where = ["--workspace", str(tmp_path)]
    assert main(["token", "create", "ci", *where]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("acps_") and len(out.splitlines()) == 1
    assert ("acp-server: the first token of this store: from now on its servers need a "
            "credential from every client, loopback included (the console, acp-server "
            "prompt: --token or $ACP_SERVER_TOKEN)\n") in err
    assert main(["token", "revoke", "ci", *where]) == 0
    assert main(["token", "create", "ci2", *where]) == 0
    assert "first token" not in capsys.readouterr().err   # revoked, it still was one


# -- the shutdown order ------------------------------------------------------------------
@pytest.mark.anyio
async def test_drain_closes_the_front_doors_then_the_sessions_then_the_agents(
        tmp_path: Path) -> None:
    """``Server.drain`` (what SIGTERM runs), recorded on the real objects: LMSP stops
    first, then the ``/acp`` connections close (their streams end), then each session
    (its REST stream ends with ``session_closed``: the in-memory journal's, whose
    sessions end with the process), then the agents."""
    import inspect
    import json
    from typing import Any

    import anyio
    from httpx_sse import aconnect_sse

    from tests.acp_http.server import running_acp_server

    async with running_acp_server(tmp_path, session_journal="memory") as srv:
        conn_id, _ = await srv.initialize()
        order: list[str] = []

        def recorded(name: str, call: Any) -> Any:
            """``call`` itself, noting in ``order`` when it starts."""
            def sync(*args: Any, **kwargs: Any) -> Any:
                order.append(name)
                return call(*args, **kwargs)

            async def coro(*args: Any, **kwargs: Any) -> Any:
                order.append(name)
                return await call(*args, **kwargs)

            return coro if inspect.iscoroutinefunction(call) else sync

        async with srv.stream(conn_id) as conn_stream:
            session_id = await srv.new_session(conn_id, conn_stream)
            rest_types: list[str] = []
            rest_open = anyio.Event()

            async def read_rest() -> None:
                async with aconnect_sse(srv.client, "GET", f"/session/{session_id}/events",
                                        headers={"Last-Event-ID": "0"}) as source:
                    assert source.response.status_code == 200
                    rest_open.set()
                    async for event in source.aiter_sse():
                        if event.data:
                            rest_types.append(json.loads(event.data)["type"])

            srv.lmsp.stop = recorded("lmsp", srv.lmsp.stop)
            srv.registry.shutdown = recorded("acp connections", srv.registry.shutdown)
            srv.bridge.close_session = recorded("session", srv.bridge.close_session)
            srv.bridge.agents.aclose = recorded("agents", srv.bridge.agents.aclose)
            async with srv.stream(conn_id, session_id) as session_stream:
                with anyio.fail_after(10):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read_rest)
                        await rest_open.wait()
                        await srv.server.drain()
                await session_stream.wait_for_end()
                await conn_stream.wait_for_end()
        assert order == ["lmsp", "acp connections", "session", "agents"]
        assert rest_types[-1] == "session_closed", rest_types
        assert srv.registry.connections == {}


@pytest.mark.parametrize("server", ["granian", "uvicorn"])
def test_sigterm_ends_open_streams_in_order_and_exits_0(tmp_path: Path, server: str) -> None:
    """On each HTTP server: SIGTERM with a REST event stream and an /acp stream open;
    the /acp stream ends, the REST stream ends with ``session_closed`` (front doors,
    then sessions; the in-memory journal's sessions end with the process), then the
    process exits 0."""
    import json
    import signal

    with ServeProcess(tmp_path, "--http-server", server,
                      "--session-journal", "memory") as child:
        with httpx.Client(base_url=child.base_url, timeout=20) as client:
            sid = client.post("/session", json={}).json()["sessionId"]
            conn = client.post("/acp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                             "params": {"protocolVersion": 1}}
                               ).headers["acp-connection-id"]
            with client.stream("GET", f"/session/{sid}/events") as rest, \
                    client.stream("GET", "/acp", headers={
                        "Acp-Connection-Id": conn, "Accept": "text/event-stream"}) as acp:
                assert rest.status_code == 200 and acp.status_code == 200
                assert child.process is not None
                child.process.send_signal(signal.SIGTERM)
                b"".join(acp.iter_raw())          # ends: the doors close first
                rest_lines = [ln for ln in rest.iter_lines() if ln.startswith("data:")]
        assert json.loads(rest_lines[-1][5:])["type"] == "session_closed", rest_lines
        assert child.process.wait(30) == 0   # a hang bound
