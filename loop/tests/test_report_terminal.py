"""The terminal report (`cgloop run`'s table) fits 100 columns, even on a wider console and
with long values, and folds a long value onto the next line instead of cutting it."""

from __future__ import annotations

import re

import pytest
from cgloop.loop.report import FaultOutcome, Latency, Lever, LoopReport, print_report
from rich.console import Console

MS = 1_000_000
LONG_FAULT = "ect1-abuser-flood-on-the-access-link-with-a-very-long-name"
LONG_KIND = "l4s_unresponsive_ecn_abuse_with_a_long_kind"
LONG_LEVER = "queue_protection_sanction_of_flow_40000>5201"
LONG_ACTION = "reprioritise_flow_into_the_low_latency_class_on_node_edge"
VERDICT = "ACTION_VERDICT_VERIFIED_IMPROVED"


def _report() -> LoopReport:
    o = FaultOutcome(
        trial="t1", fault=LONG_FAULT, kind=LONG_KIND, onset_ns=0, end_ns=10_000 * MS,
        affected=True, recovered_ns=1234 * MS, detection_ns=45 * MS,
        detection_kind="slo_latency", decision_ns=60 * MS, applied_ns=70 * MS,
        verified_ns=1900 * MS, verdict=VERDICT, action=LONG_ACTION, first_level="node",
        first_lever=LONG_LEVER, first_node="edge1", first_ns=12 * MS,
        before=Latency(p99_ms=3.2), during=Latency(p99_ms=1234.5), after=Latency(p99_ms=4.1),
        levers=[
            Lever(operation=LONG_ACTION, level="micro", node="edge1",
                  verdict="verified (improved)"),
            Lever(operation="onos_flow_rule", level="global", node="of:0000000000000001",
                  verdict="failed"),
        ],
        node_actions=[(12.0, "queue_protection_sanction", "1>2"), (13.0, "release", "1>2")],
    )
    quiet = o.model_copy(update={"fault": "flood", "kind": "congestion", "affected": False})
    rows = {"flows": 123456, "packets": 9999999, "detections": 1234, "actions": 88,
            "action_results": 77, "int_reports": 123456789, "queue_samples": 99999}
    return LoopReport(run_dir="/run", slo_p99_ms=20, loop="two-level loop",
                      faults=[o, quiet], gaming_flows_classified=3, rows=rows,
                      notes=["power: an emulated sysfs tree", "core: ([int_export] refused)"],
                      onos={"flows": 2})


def _cells(text: str) -> list[list[str]]:
    """Each body row's cells, the folded fragments of a cell joined without whitespace."""
    rows, current = [], None
    for line in text.splitlines():
        if line.startswith(("┡", "├")):
            current = None
        elif line.startswith("│"):
            parts = line.split("│")[1:-1]
            if current is None:
                current = [""] * len(parts)
                rows.append(current)
            for i, p in enumerate(parts):
                current[i] += re.sub(r"\s", "", p)
    return rows


@pytest.mark.parametrize("console_width", [100, 160, 200])
def test_terminal_table_fits_100_columns_and_folds_long_values(console_width):
    console = Console(width=console_width, record=True, color_system=None)
    report = _report()
    print_report(report, console)
    text = console.export_text()
    widest = max(len(line) for line in text.splitlines())
    assert widest <= 100, f"a line of {widest} columns:\n{text}"
    assert "…" not in text, f"a value was cut:\n{text}"
    want = [
        f"{LONG_FAULT} ({LONG_KIND})", f"12 ms {LONG_LEVER} (node) edge1", "45 slo_latency",
        "60 / 70 / 1900", "1234",
        f"{LONG_ACTION} micro edge1: verified (improved) onos_flow_rule global "
        "of:0000000000000001: failed",
        "3.2 / 1234.5 / 4.1 ms",
    ]
    rows = _cells(text)
    assert len(rows) == 2, text
    assert rows[0] == [re.sub(r"\s", "", w) for w in want], text
    assert rows[1][0] == "flood(congestion)" and rows[1][4] == "notaffected", text
    flat = re.sub(r"\s", "", text)
    for k, v in report.rows.items():
        assert f"{k}{v}" in flat, f"row count {k} {v} missing:\n{text}"
    # which levers acted and were verified, the node's own (a release is not a lever), ONOS,
    # and what is emulated
    assert f"{LONG_ACTION}2/2" in flat and "onos_flow_rule2/0" in flat, text
    assert "queue_protection_sanction(node)2" in flat and "release" not in flat, text
    assert "ONOScontractserverrecorded:flows2" in flat and "emulatedsysfs" in flat, text
    assert "([int_export]refused)" in flat, text  # a note is plain text, not rich markup


def test_levers_count_what_acted_and_what_was_verified():
    report = _report()
    assert report.levers() == {
        LONG_ACTION: (2, 2), "onos_flow_rule": (2, 0), "queue_protection_sanction (node)": (2, 0),
    }


def test_terminal_table_follows_a_narrower_console():
    console = Console(width=80, record=True, color_system=None)
    print_report(_report(), console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
