"""The conformance runner names its target without the credentials of its address
(``--url``-like ``http://user:secret@host/?token=…``): on stderr, in the table and in
the JSON and JUnit reports (``acp_server.client.errors.redact``)."""

from __future__ import annotations

import os
import subprocess
import sys

from acp_server.conformance.report import Report
from tests.sdk.harness import closed_port_url
from tests.sdk.test_redaction import SECRETS, shown, with_credentials
from tests.terminal import cli_env


def test_conformance_does_not_show_the_credentials(tmp_path: os.PathLike[str]) -> None:
    target = closed_port_url()
    report = f"{tmp_path}/report.json"
    done = subprocess.run([sys.executable, "-m", "acp_server", "conformance",
                           with_credentials(target), "--json", report],
                          capture_output=True, text=True, env=cli_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"acp-server conformance: cannot reach {shown(target)}: "
                           "connection refused\n")
    assert not any(secret in done.stdout for secret in SECRETS), done.stdout


def test_a_conformance_report_names_its_target_without_credentials() -> None:
    report = Report(target="http://user:secret@h:1/?token=abc123", started_at="x", results=[])
    assert b"secret" not in report.json_bytes() and b"abc123" not in report.json_bytes()
    assert b"secret" not in report.junit_bytes() and b"abc123" not in report.junit_bytes()
