"""The suite's last step: results and report reach the disk before the plots, and survive them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.routing_bench import suite
from tests.benchmarks.routing_bench.test_report import ROWS

META = {"date": "2026-01-01", "fleet": {"fleet": "sim"}, "seeds": [0]}


def test_a_plot_failure_keeps_results_report_and_the_plots_already_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen_on_disk: list[set[str]] = []

    def failing_plots(
        rows: Sequence[Mapping[str, Any]], out: Path, simulated: bool
    ) -> Iterator[Path]:
        seen_on_disk.append({p.name for p in out.iterdir()})
        first = out / "shared_prefix_ttft_p90.png"
        first.write_bytes(b"\x89PNG")
        yield first
        raise RuntimeError("no backend")

    monkeypatch.setattr(suite, "iter_plots", failing_plots)
    with caplog.at_level(logging.ERROR, logger=suite.__name__):
        plots = suite.write_outputs(tmp_path, META, ROWS, [], simulated=True)
    # The results were written before plotting began.
    assert seen_on_disk == [{"results.json", "report.md"}]
    assert plots == [tmp_path / "shared_prefix_ttft_p90.png"]
    assert len(json.loads((tmp_path / "results.json").read_text())["rows"]) == len(ROWS)
    md = (tmp_path / "report.md").read_text()
    assert "![shared_prefix_ttft_p90](shared_prefix_ttft_p90.png)" in md
    assert "shared_prefix_tput.png" not in md and "### low_sharing (simulated)" in md
    (record,) = caplog.records
    assert "plotting failed after 1 plot(s)" in record.getMessage()
    assert record.exc_info is not None and "no backend" in str(record.exc_info[1])


def test_a_failure_before_the_first_plot_leaves_a_report_without_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_matplotlib(
        rows: Sequence[Mapping[str, Any]], out: Path, simulated: bool
    ) -> Iterator[Path]:
        raise ImportError("No module named 'matplotlib'")
        yield out  # pragma: no cover - makes this a generator, as iter_plots is

    monkeypatch.setattr(suite, "iter_plots", no_matplotlib)
    with caplog.at_level(logging.ERROR, logger=suite.__name__):
        assert suite.write_outputs(tmp_path, META, ROWS, [], simulated=True) == []
    md = (tmp_path / "report.md").read_text()
    assert "### shared_prefix (simulated)" in md and ".png" not in md
    assert (tmp_path / "results.json").exists()
    assert "plotting failed after 0 plot(s)" in caplog.text


def test_plots_are_listed_in_the_report_when_they_all_succeed(tmp_path: Path) -> None:
    plots = suite.write_outputs(tmp_path, META, ROWS, [], simulated=True)
    assert {p.name for p in plots} == {
        f"{w}_{k}.png" for w in ("low_sharing", "shared_prefix") for k in ("ttft_p90", "tput")
    }
    md = (tmp_path / "report.md").read_text()
    assert all(f"![{p.stem}]({p.name})" in md for p in plots)
