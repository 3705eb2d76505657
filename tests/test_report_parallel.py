"""A report's work in forked workers (reports/forked.py, reports/report_jobs.py, the parallel
reading in reports/record_index.py): the same files as one process, and a worker that fails or
dies costs nothing but time."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from record_factory import make_record, write_records

import reports.forked as forked
from reports.aggregate import load_results
from reports.leaderboard import write_report

TESTS = Path(__file__).parent
# The test process has torch loaded (conftest), where a report never forks: the parallel runs
# are made in a fresh interpreter, as `harness report` runs.
_PRELUDE = f"""
import os, pickle, sys
sys.path.insert(0, {str(TESTS)!r})
import reports.forked as forked
import reports.record_index as record_index
import reports.report_jobs as report_jobs
from pathlib import Path
if not forked.can_fork():
    sys.exit(42)
record_index.PARALLEL_MIN = 2  # this folder's records are read by workers too
"""


def _in_fresh_process(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + code], capture_output=True, text=True)
    if proc.returncode == 42:
        pytest.skip("no fork here (one core, or not POSIX)")
    assert proc.returncode == 0, proc.stderr[-3000:]


def _folder(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    recs = [
        make_record(method=m, M=M, seed=s, acc=0.8 + 0.01 * M + 0.003 * s)
        for m, M in (("deep_ensemble", 4), ("deep_ensemble", 2), ("single", 1), ("sigma_ens", 4))
        for s in range(5)
    ]
    recs.append(make_record(method="batch_ensemble", status="failed"))
    write_records(results, recs)
    bad = results / "damaged"
    bad.mkdir()
    (bad / "record.json").write_text('{"schema_version": 2, "cell_id": ')  # truncated
    return results


def _files(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, less the time the report was generated."""
    return {
        p.name: re.sub(rb"report generated.*?(</dd>|$)", b"", p.read_bytes(), flags=re.M)
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


_FORMATS = ("csv", "md", "latex")
_REPORT = f"""
from reports.leaderboard import write_report
write_report(Path(sys.argv[1]), Path(sys.argv[2]), index=False, parallel=True, formats={_FORMATS})
"""


@pytest.mark.slow  # a fresh interpreter
def test_workers_write_what_one_process_writes(tmp_path):
    """Every file (page, CSVs, Markdown, LaTeX, each figure's PNG and PDF) the same bytes,
    with the records read by workers too."""
    results = _folder(tmp_path)
    write_report(results, tmp_path / "serial", index=False, parallel=False, formats=_FORMATS)
    serial = _files(tmp_path / "serial")
    _in_fresh_process(_REPORT.replace("sys.argv[1]", repr(str(results))).replace(
        "sys.argv[2]", repr(str(tmp_path / "parallel"))))  # fmt: skip
    parallel = _files(tmp_path / "parallel")
    assert sorted(parallel) == sorted(serial)
    assert {"fig-quality-vs-m.png", "fig-quality-vs-m.pdf", "leaderboard.tex"} <= set(serial)
    for name, data in serial.items():
        assert parallel[name] == data, name


@pytest.mark.slow  # a fresh interpreter
def test_records_read_by_workers_are_the_rows_and_problems_of_one_process(tmp_path):
    results = _folder(tmp_path)
    marks, out = tmp_path / "marks", tmp_path / "results.pkl"
    marks.mkdir()
    _in_fresh_process(f"""
from reports.aggregate import load_results
real = record_index._read_shared
def marked(start, stop):  # the worker's reading, leaving a file naming its process
    Path({str(marks)!r}, f"{{os.getpid()}}-{{start}}-{{stop}}").touch()
    return real(start, stop)
record_index._read_shared = marked
r = load_results(Path({str(results)!r}), index=False, parallel=True)
Path({str(out)!r}).write_bytes(pickle.dumps((r.cells, r.summary, r.problems, os.getpid())))
""")
    cells, summary, problems, parent = pickle.loads(out.read_bytes())
    one = load_results(results, index=False, parallel=False)
    pd.testing.assert_frame_equal(one.cells, cells)
    pd.testing.assert_frame_equal(one.summary, summary)
    assert [(p.cell_id, p.status, p.reason) for p in problems] == [
        (p.cell_id, p.status, p.reason) for p in one.problems
    ]
    assert [p.status for p in problems].count("invalid") == 1 and len(cells) == 21
    shares = [p.name.split("-") for p in marks.iterdir()]
    assert shares and all(int(pid) != parent for pid, *_ in shares)  # read by workers


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["os._exit(3)", "raise RuntimeError('failed')"])
def test_a_failed_worker_is_redone_here_with_the_same_files(tmp_path, failure):
    """A worker killed mid-job (out of memory, say) or failing: this process does its job."""
    results = _folder(tmp_path)
    write_report(results, tmp_path / "serial", index=False, parallel=False, formats=_FORMATS)
    patch = f"""
def failing(*args):
    {failure}
report_jobs._tables_in_worker = report_jobs._figure_in_worker = failing
record_index._read_shared = failing
"""
    _in_fresh_process(patch + _REPORT.replace("sys.argv[1]", repr(str(results))).replace(
        "sys.argv[2]", repr(str(tmp_path / "parallel"))))  # fmt: skip
    assert _files(tmp_path / "parallel") == _files(tmp_path / "serial")


def test_no_fork_where_it_is_unsafe(monkeypatch):
    monkeypatch.setattr(forked, "cores", lambda: 2)
    monkeypatch.delitem(sys.modules, "torch")  # (loaded by conftest: a test of its own below)
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # (other tests leave tqdm's)
    assert forked.can_fork()
    monkeypatch.setenv("HARNESS_REPORT_SERIAL", "1")
    assert not forked.can_fork()
    monkeypatch.delenv("HARNESS_REPORT_SERIAL")
    # Another thread may hold a lock the child would inherit, locked for ever.
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert not forked.can_fork()
    with forked.pool(2) as executor:
        assert executor is None
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(forked, "cores", lambda: 1)
    assert not forked.can_fork()


@pytest.mark.slow  # a fresh interpreter
def test_no_fork_once_torch_is_loaded():
    code = "import torch, reports.forked as f; print(f.can_fork())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_figure_ids_known_without_matplotlib_are_the_figures():
    from reports.figure_selection import FIGURE_IDS
    from reports.figures import FIGURES

    assert tuple(spec.id for spec in FIGURES) == FIGURE_IDS
