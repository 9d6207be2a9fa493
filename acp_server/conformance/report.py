"""The reports: a JSON document, JUnit XML, and the exit status they imply.

    report = Report(target=url, started_at="2026-12-01T09:30:00Z", results=[...])
    Path("out.json").write_bytes(report.json_bytes())
    Path("out.xml").write_bytes(report.junit_bytes())
    sys.exit(report.exit_status())      # 0: checks ran, no MUST failed; 1: one did

JSON: ``{"target", "started_at", "summary", "checks": [{"id", "suite", "level",
"outcome": "pass"|"fail"|"skip", "detail", "reference"}]}``. JUnit: one ``testsuite``
per suite, one ``testcase`` per check (classname ``conformance.<suite>``); a failed
check is a ``failure`` whose ``type`` is its level, a skipped one ``skipped``. The
target is named without the credentials of its address (``errors.redact``). The exit
status: 0 when some check ran (passed or failed) and no MUST check failed, 1 when one
did, ``EXIT_NOTHING_CHECKED`` (2, as for bad usage) when no check ran (every one
skipped): a gate that checked nothing does not pass.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

from acp_server.client.errors import redact
from acp_server.conformance.catalog import CHECKS
from acp_server.conformance.context import Result

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_NOTHING_CHECKED = EXIT_USAGE   # the run could not check the target: no verdict


@dataclass
class Report:
    target: str
    started_at: str
    results: list[Result] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.target = redact(self.target)   # no credentials of the address in a report

    def summary(self) -> dict[str, int]:
        counts = Counter(r.outcome for r in self.results)
        must = sum(1 for r in self.results if r.outcome == "fail" and r.level == "MUST")
        return {"pass": counts["pass"], "fail": counts["fail"], "skip": counts["skip"],
                "must_failed": must}

    @property
    def checked(self) -> bool:
        """Some check ran: it passed or failed (not every one skipped)."""
        return any(r.outcome != "skip" for r in self.results)

    def exit_status(self) -> int:
        if self.summary()["must_failed"]:
            return EXIT_FAILED
        return EXIT_OK if self.checked else EXIT_NOTHING_CHECKED

    def as_dict(self) -> dict[str, object]:
        return {"target": self.target, "started_at": self.started_at,
                "summary": self.summary(),
                "checks": [{"id": r.id, "suite": r.suite, "level": r.level,
                            "outcome": r.outcome, "detail": r.detail,
                            "reference": CHECKS[r.id].reference} for r in self.results]}

    def json_bytes(self) -> bytes:
        return json.dumps(self.as_dict(), indent=2).encode() + b"\n"

    def junit_bytes(self) -> bytes:
        root = ET.Element("testsuites", name="acp-server conformance", tests=str(len(self.results)))
        for suite in dict.fromkeys(r.suite for r in self.results):
            mine = [r for r in self.results if r.suite == suite]
            counts = Counter(r.outcome for r in mine)
            node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(mine)),
                                 failures=str(counts["fail"]), skipped=str(counts["skip"]),
                                 errors="0", timestamp=self.started_at)
            ET.SubElement(ET.SubElement(node, "properties"), "property", name="target",
                          value=self.target)
            for result in mine:
                case = ET.SubElement(node, "testcase", classname=f"conformance.{suite}",
                                     name=result.id)
                if result.outcome == "fail":
                    failure = ET.SubElement(case, "failure", type=result.level,
                                            message=result.detail[:200])
                    failure.text = f"{CHECKS[result.id].reference}\n{result.detail}"
                elif result.outcome == "skip":
                    ET.SubElement(case, "skipped", message=result.detail)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
