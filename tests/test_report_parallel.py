"""A report's work in forked workers (reports/forked.py, reports/report_jobs.py, the parallel
reading in reports/record_index.py): the same files as one process, and a worker that fails or
dies costs nothing but time."""

from __future__ import annotations

import gc
import os
import pickle
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from record_factory import make_record, write_records

import reports.forked as forked
import reports.row_cache as row_cache
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
_collect = forked.collect
def collect(future, fn, *args):  # note each job a worker did (collect redoes a failed one here)
    if future is not None and future.exception() is None and os.environ.get("JOBS_DIR"):
        Path(os.environ["JOBS_DIR"], fn.__name__).touch()
    return _collect(future, fn, *args)
forked.collect = collect
"""


def _in_fresh_process(code: str, jobs: Path | None = None) -> None:
    """Run ``code`` after :data:`_PRELUDE`; ``jobs``: a folder where each job a worker did leaves
    a file named after it."""
    env = {**os.environ, "JOBS_DIR": str(jobs or "")}
    cmd = [sys.executable, "-c", _PRELUDE + code]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
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
write_report(Path(sys.argv[1]), Path(sys.argv[2]), index=False, parallel=True, formats={_FORMATS},
             figures=FIGURES)
"""


def _report_code(results: Path, out: Path, figures: bool) -> str:
    code = _REPORT.replace("sys.argv[1]", repr(str(results))).replace("sys.argv[2]", repr(str(out)))
    return code.replace("FIGURES", repr(figures))


# Figures drawn by workers, or the tables written by one. The second runs in the default test
# run, though it starts an interpreter (~3 s): the default run must cover what `harness report`
# does by default.
@pytest.mark.parametrize("figures", [pytest.param(True, marks=pytest.mark.slow), False])
def test_workers_write_what_one_process_writes(tmp_path, figures):
    """Every file (page, CSVs, Markdown, LaTeX, each figure's PNG and PDF) the same bytes,
    with the records read by workers too."""
    results = _folder(tmp_path)
    write_report(results, tmp_path / "serial", index=False, parallel=False, formats=_FORMATS,
                 figures=figures)  # fmt: skip
    serial = _files(tmp_path / "serial")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    _in_fresh_process(_report_code(results, tmp_path / "parallel", figures), jobs)
    parallel = _files(tmp_path / "parallel")
    # Done by workers: the records read, and the figures, or the bold cells with the tables of
    # the results (_results_job) and the other tables.
    done = (
        {"_read_chunk", "draw_figure"}
        if figures
        else {"_read_chunk", "_results_job", "write_tables"}
    )
    assert {p.name for p in jobs.iterdir()} == done
    assert sorted(parallel) == sorted(serial)
    drawn = {"fig-quality-vs-m.png", "fig-quality-vs-m.pdf"}
    assert drawn <= set(serial) if figures else not drawn & set(serial)
    assert "leaderboard.tex" in serial
    for name, data in serial.items():
        assert parallel[name] == data, name


@pytest.mark.slow  # a fresh interpreter
def test_a_warm_report_without_figures_forks_no_worker(tmp_path):
    """With the last report's rows at hand and no figure to draw, what is left is cheaper than
    a fork: one process does it, and writes what a cold report writes."""
    results = _folder(tmp_path)
    write_report(results, tmp_path / "cold", index=False, parallel=False, formats=_FORMATS,
                 figures=False)  # fmt: skip
    code = f"""
from reports.leaderboard import write_report
for _ in range(2):
    write_report(Path({str(results)!r}), Path({str(tmp_path / "warm")!r}), parallel=True,
                 formats={_FORMATS}, figures=False)
    if os.environ["JOBS_DIR"]:  # the first report's jobs (a cold row cache): done by workers
        done = sorted(p.name for p in Path(os.environ["JOBS_DIR"]).iterdir())
        assert done == ["_read_chunk", "_results_job", "write_tables"], done
        for p in Path(os.environ["JOBS_DIR"]).iterdir():
            p.unlink()
        os.environ["JOBS_DIR"] = ""
"""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    _in_fresh_process(code, jobs)
    assert list(jobs.iterdir()) == []  # the second report: no job done by a worker
    warm = {k: v for k, v in _files(tmp_path / "warm").items() if not k.startswith(".")}
    assert warm == _files(tmp_path / "cold")  # (less the caches)


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
@pytest.mark.parametrize("figures", [True, False])
@pytest.mark.parametrize("failure", ["os._exit(3)", "raise RuntimeError('failed')"])
def test_a_failed_worker_is_redone_here_with_the_same_files(tmp_path, failure, figures):
    """A worker killed mid-job (out of memory, say) or failing: this process does its job."""
    results = _folder(tmp_path)
    write_report(results, tmp_path / "serial", index=False, parallel=False, formats=_FORMATS,
                 figures=figures)  # fmt: skip
    patch = f"""
def failing(*args):
    {failure}
report_jobs._tables_in_worker = report_jobs._figure_in_worker = failing
report_jobs._results_in_worker = record_index._read_shared = failing
"""
    _in_fresh_process(patch + _report_code(results, tmp_path / "parallel", figures))
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


def _forkable(monkeypatch) -> None:
    monkeypatch.setattr(forked, "cores", lambda: 2)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(threading, "active_count", lambda: 1)


class _Refused:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("no semaphores here")  # what a sandbox without /dev/shm says


def test_a_pool_that_cannot_start_leaves_the_work_here_and_nothing_behind(monkeypatch):
    _forkable(monkeypatch)
    monkeypatch.setattr(forked, "ProcessPoolExecutor", _Refused)
    with forked.pool(2, shared=[1, 2]) as executor:
        assert executor is None
        assert forked.collect(forked.start(executor, len, "ab"), len, "abc") == 3
    assert forked.shared() is None and gc.get_freeze_count() == 0


@pytest.mark.slow  # a fresh interpreter
def test_workers_die_with_a_killed_report(tmp_path):
    """A report killed outright (the OOM killer) must not leave workers holding its memory."""
    pids = tmp_path / "pids"
    _in_fresh_process(f"""
import signal
pid = os.fork()
if pid == 0:  # the report, killed while its pool is open
    null = os.open(os.devnull, os.O_WRONLY)  # workers left behind must not hold the test's pipes
    os.dup2(null, 1)
    os.dup2(null, 2)
    with forked.pool(2, shared=1) as executor:
        Path({str(pids)!r}).write_text(" ".join(map(str, executor._processes)))
        os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(pid, 0)
""")
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2
    for _ in range(100):
        alive = [p for p in workers if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return "Z"


@pytest.mark.slow  # a fresh interpreter
def test_a_warm_report_with_workers_writes_what_one_process_writes(tmp_path):
    """With the index and the caches: a cold report, one record changed, a warm one — the
    same files (caches included) with workers as in one process."""
    import json

    outs = {}
    for mode in ("serial", "parallel"):
        results = _folder(tmp_path / mode)
        report = _report_code(results, tmp_path / mode / "page", False).replace(
            "index=False", "index=True"
        )
        rec_path = next(iter(sorted(results.glob("*/record.json"))))
        change = f"""
p = Path({str(rec_path)!r})
rec = json.loads(p.read_text())
rec["metrics"]["clean"]["acc"] = 0.5
p.write_text(json.dumps(rec))
t = os.path.getmtime(p) - 30
os.utime(p, (t, t))
"""
        code = "import json\n" + report + change + report
        if mode == "serial":
            code = "forked.can_fork = lambda: False\n" + code
        _in_fresh_process(code)
        root = str(tmp_path / mode).encode()  # the pages name their results folder
        outs[mode] = {
            k: v.replace(root, b"ROOT") for k, v in _files(tmp_path / mode / "page").items()
        }
    assert sorted(outs["parallel"]) == sorted(outs["serial"])
    for name, data in outs["serial"].items():
        if name == ".report-rows.json":  # it keys CSV spans by the files' mtimes; the rows'
            # markup by where it is in each mode's page (whose folder names differ in length)
            data, other = (
                row_cache._page_texts(json.loads((tmp_path / m / "page" / name).read_bytes())[
                    "rows"], json.loads((tmp_path / m / "page" / name).read_bytes())["page"],
                    tmp_path / m / "page" / "leaderboard.html")
                for m in ("serial", "parallel")
            )  # fmt: skip
            assert other == data and any("cells_html" in v for v in data.values())
        else:
            assert outs["parallel"][name] == data, name
