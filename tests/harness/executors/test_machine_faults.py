"""Faults of the machine (issue 42): a full disk or quota, memory running out, a worker killed.

- a full file system names the file and says "no space" in one line; the file it was replacing
  stays whole; no cell starts after the first such failure, the run says how many were left
  pending and exits non-zero; after space is freed a re-run finishes every cell (in-process with
  the fault injected at the write call, and — slow, root — on a real small tmpfs through the
  CLI with local workers);
- an out-of-memory error in a training step fails that cell in one line (cell, batch size,
  peak, advice) and the grid goes on;
- a worker SIGKILLed mid-cell is replaced and its cell retried once from its checkpoint; a cell
  that kills its worker twice is failed, not retried a third time (slow: worker processes);
- ``harness validate`` refuses a data root that is a file (or cannot be created), a results
  folder without room for one cell, and a ``pretrained:`` file of another architecture, each in
  one line naming the path, exit 2;
- no message shows a traceback without ``--debug``.
"""

from __future__ import annotations

import errno
import io
import json
import re
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.storage.checkpoint import read_events
from tests.fixtures.machine_faults import (
    attempts,
    fault_env,
    fill,
    inject_full_disk,
    small_filesystem,
    snapshot,
    write_kill_plan,
)

GRID = """
name: {name}
grid:
  datasets: [digits]
  backbones: [{{name: digits_cnn, kwargs: {{width: 4}}}}]
  seeds: {seeds}
  methods: [single]
recipe: {{epochs: {epochs}, batch_size: 128, lr: 0.05}}
evaluation: {{cost: false}}
"""


def write_grid(folder: Path, name: str, seeds: str = "[0, 1, 2]", epochs: int = 2) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(GRID).format(name=name, seeds=seeds, epochs=epochs))
    return path


def cells_of(suite: Path):
    from harness.config.parse import load_suite

    return load_suite(suite).cells()


def train_starts(cell_dir: Path) -> list[int]:
    return [e["from_epoch"] for e in read_events(cell_dir) if e["event"] == "train"]


def statuses(folder: Path) -> dict[str, str]:
    return {
        p.parent.name: json.loads(p.read_text())["status"] for p in folder.glob("*/record.json")
    }


# ------------------------------------------------------------------------------- out of space


def fault_line(out: str, cell_id: str) -> str:
    """The OutOfSpace message of ``cell_id`` in the run's FAILED line."""
    line = next(x for x in out.splitlines() if x.startswith(f"FAILED {cell_id} "))
    return line.split(": OutOfSpace: ", 1)[1]


def test_out_of_space_error_names_the_path_under_torch_save(tmp_path):
    """``torch.save`` into a file object turns ENOSPC into ``RuntimeError: unexpected pos``:
    the writer still names its own path (not the temporary file) and the space left."""
    from harness.storage.space import OutOfSpace, out_of_space_cause

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos"
            ) from None
    except RuntimeError as exc:
        assert out_of_space_cause(exc).errno == errno.ENOSPC
    with small_filesystem(tmp_path / "fs", "256k") as fs:
        target = fs / "cell" / "checkpoint.pt"
        from harness.storage.checkpoint import save_atomic

        save_atomic({"w": torch.ones(1000)}, target)
        good = target.read_bytes()
        with pytest.raises(OutOfSpace) as info:
            save_atomic({"w": torch.ones(200_000)}, target)  # 800 kB on a 256 kB file system
        line = str(info.value)
        assert re.fullmatch(
            rf"{re.escape(str(target))}: no space left on device: the file system is full "
            r"\(\d+\.\d (B|KiB) free of 256\.0 KiB\)",
            line,
        ), line
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
        assert target.read_bytes() == good  # the good checkpoint was never replaced
        assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint.pt"]  # no .tmp


def test_full_disk_in_the_corruption_cache_names_the_cache_file(tmp_path):
    """The corruption cache under the data root has its own atomic writer: a full disk there
    names the cache file (the data root may be on another file system than the results)."""
    from harness.data._machinery import corruptions
    from harness.storage.space import OutOfSpace

    target = tmp_path / "data" / "generated-c" / "digits" / "gaussian_noise.npy"

    def write(f):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    with pytest.raises(OutOfSpace) as info:
        corruptions._atomic_write(target, write)
    assert str(info.value).startswith(f"{target}: no space left: the disk quota is exceeded (")
    assert list(target.parent.iterdir()) == []  # no temporary file left behind


def test_full_disk_stops_the_run_keeps_what_was_written_and_a_rerun_finishes(
    tmp_path, monkeypatch, capsys
):
    """Three cells in this process; the middle one's second checkpoint meets a full disk."""
    suite = write_grid(tmp_path, "full")
    results = tmp_path / "results"
    folder = results / "full"
    cells = cells_of(suite)
    first, hit, last = (c.cell_id for c in cells)
    fault = inject_full_disk(monkeypatch, folder, hit, "checkpoint.pt", nth=2)

    rc = main(["run", str(suite), "--executor", "inprocess", "--results", str(results), "-q"])
    out, err = capsys.readouterr()
    assert rc == 1, (out, err)
    ckpt = folder / hit / "checkpoint.pt"
    line = next(x for x in out.splitlines() if x.startswith("stopped starting cells"))
    assert line == (
        f"stopped starting cells after cell {hit} failed: {ckpt}: no space left on device: the "
        f"file system is full ({line.split('is full (')[1].split(')')[0]}); 1 cell left pending "
        "(not started); free space (or raise the quota) and run the same command again: "
        "finished cells are kept, started ones resume from their last checkpoint"
    )
    assert f"FAILED {hit} single seed 1: OutOfSpace: {ckpt}: no space left on device" in out
    assert "Traceback" not in out + err
    # Nothing started after the failure; what was written before it is byte for byte the same.
    assert not (folder / last).exists()
    assert fault.before is not None and str(ckpt) in fault.before
    after = snapshot(folder)
    assert {p: after[p] for p in fault.before} == fault.before
    assert statuses(folder) == {first: "done", hit: "failed"}
    assert not list(folder.glob("*/.*.tmp")) and not list(folder.glob("*/lease.json"))

    # `harness status` shows the cell failed with that one line, no traceback under it.
    assert main(["status", str(folder)]) == 0
    shown = capsys.readouterr().out
    failed = shown.splitlines()[shown.splitlines().index(next(
        x for x in shown.splitlines() if x.startswith(f"failed   {hit}")
    )) + 1]  # fmt: skip
    assert failed.strip() == f"| OutOfSpace: {fault_line(out, hit)}", shown
    assert "Traceback" not in shown and 'File "' not in shown
    assert re.search(rf"^pending  {last} ", shown, re.M), shown

    fault.on = False  # space freed
    rc = main(["run", str(suite), "--executor", "inprocess", "--results", str(results), "-q"])
    out, err = capsys.readouterr()
    assert rc == 0, (out, err)
    assert statuses(folder) == dict.fromkeys([first, hit, last], "done")
    assert train_starts(folder / hit) == [0, 1]  # resumed from the whole epoch-1 checkpoint
    assert (folder / first / "record.json").read_bytes() == fault.before[
        str(folder / first / "record.json")
    ]  # the finished cell was not redone


def test_a_record_that_does_not_fit_leaves_the_cell_resumable(tmp_path, monkeypatch):
    """Training finished but ``record.json`` met the full disk: the executor still learns why
    (the returned record) and stops; the re-run only evaluates."""
    from harness.executors.faults import MachineFaults
    from harness.executors.local import run_inprocess

    cells = cells_of(write_grid(tmp_path, "rec", seeds="[0, 1]", epochs=1))
    folder = tmp_path / "rec"
    fault = inject_full_disk(monkeypatch, folder, cells[0].cell_id, "record.json")
    faults = MachineFaults()
    recs = run_inprocess(cells, folder, None, progress=False, faults=faults)
    assert len(recs) == 1 and recs[0]["status"] == "failed"
    assert recs[0]["error"]["type"] == "OutOfSpace" and recs[0]["error"]["phase"] == "evaluate"
    assert recs[0]["error"]["message"].startswith(f"{folder / cells[0].cell_id / 'record.json'}: ")
    assert not (folder / cells[0].cell_id / "record.json").exists()
    assert faults.stop_line(len(cells) - len(recs)).count("1 cell left pending") == 1
    fault.on = False
    recs = run_inprocess(cells, folder, None, progress=False)
    assert [r["status"] for r in recs] == ["done", "done"]
    events = [e["event"] for e in read_events(folder / cells[0].cell_id)]
    assert events[-2:] == ["evaluate_only", "done"] and events.count("trained") == 1


def test_out_of_space_raised_by_a_run_stops_the_executor_too(tmp_path, monkeypatch):
    """A full disk outside a cell's recorded phases (the lease, a damaged record's event) makes
    ``run_cell`` raise: the executor turns it into the same failure and stops the same way."""
    from harness.engine import runner
    from harness.executors.faults import MachineFaults, outcome_after
    from harness.executors.local import run_inprocess
    from harness.storage.space import out_of_space

    cells = cells_of(write_grid(tmp_path, "raise"))
    lease = tmp_path / "raise" / cells[0].cell_id / "lease.json"

    def no_room(cell, *args, **kwargs):
        raise out_of_space(lease, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(runner, "run_cell", no_room)
    faults = MachineFaults()
    recs = run_inprocess(cells, tmp_path / "raise", None, progress=False, faults=faults)
    ((rec,),) = [recs]
    assert rec["cell_id"] == cells[0].cell_id and rec["status"] == "failed"
    assert {k: rec["error"][k] for k in ("type", "phase", "data_missing")} == {
        "type": "OutOfSpace", "phase": "setup", "data_missing": False
    }  # fmt: skip
    expected = rf"{re.escape(str(lease))}: no space left on device: the file system is full "
    assert re.fullmatch(expected + r"\([\d.]+ \w+ free of [\d.]+ \w+\)", rec["error"]["message"])
    outcome = outcome_after(faults, recs, len(cells))
    assert outcome.halted and outcome.messages[-1].startswith(
        f"stopped starting cells after cell {cells[0].cell_id} failed: {lease}: no space left on "
    )
    assert "; 2 cells left pending (not started); " in outcome.messages[-1]


# ----------------------------------------------------------------------------- out of memory


def test_out_of_memory_in_a_training_step_fails_that_cell_in_one_line(tmp_path, monkeypatch):
    from harness.engine import runner
    from harness.executors.local import run_inprocess

    cells = cells_of(write_grid(tmp_path, "oom", seeds="[0, 1]", epochs=1))
    real = runner.train_epoch
    victim = cells[0]

    def step(model, loader, *args, **kwargs):
        if runner_cell["id"] == victim.cell_id:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)"
            )
        return real(model, loader, *args, **kwargs)

    runner_cell = {"id": None}
    real_run_leased = runner._run_leased

    def run_leased(cell, *args, **kwargs):
        runner_cell["id"] = cell.cell_id
        return real_run_leased(cell, *args, **kwargs)

    monkeypatch.setattr(runner, "train_epoch", step)
    monkeypatch.setattr(runner, "_run_leased", run_leased)
    recs = run_inprocess(cells, tmp_path / "oom", None, progress=False)
    assert [r["status"] for r in recs] == ["failed", "done"]  # the grid went on
    error = recs[0]["error"]
    assert error["type"] == "OutOfMemoryError" and error["phase"] == "train"
    message = error["message"]
    assert "\n" not in message
    assert message.startswith(
        f"out of memory in train of cell {victim.cell_id} ({victim.label}): batch_size 128, "
        "eval_batch_size 512, processes 1; peak "
    ), message
    assert re.search(r"; peak [\d,]+ MiB resident in this process \(CPU\); lower "
                     r"recipe\.batch_size or recipe\.eval_batch_size, or run fewer cells at "
                     r"once \(--workers\)$", message), message  # fmt: skip


# ------------------------------------------------------------------------- validate: machine


def test_validate_refuses_a_data_root_that_is_a_file(tmp_path, capsys):
    suite = write_grid(tmp_path, "root")
    a_file = tmp_path / "data.txt"
    a_file.write_text("not a folder")
    for root, expected in [
        (a_file, f"{a_file}: the data root is not a directory"),
        (a_file / "sub", f"{a_file / 'sub'}: the data root cannot be created: {a_file} is not "
                         "a directory"),
    ]:  # fmt: skip
        rc = main(["validate", str(suite), "--data-root", str(root)])
        out, err = capsys.readouterr()
        assert rc == 2 and err.strip() == expected, (out, err)
        assert "Traceback" not in out + err


def test_validate_refuses_results_under_a_file(tmp_path, capsys):
    """`--results /etc/hostname` (a file) passed validate and failed at the first record."""
    suite = write_grid(tmp_path, "res")
    a_file = tmp_path / "hostname"
    a_file.write_text("not a folder")
    rc = main(["validate", str(suite), "--results", str(a_file)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.strip() == (
        f"{a_file / 'res'}: the results folder cannot be created: {a_file} is not a directory"
    ), (out, err)
    (tmp_path / "ok").mkdir()
    assert main(["validate", str(suite), "--results", str(tmp_path / "ok")]) == 0


def test_validate_refuses_a_results_folder_without_room_for_one_cell(tmp_path, capsys):
    from harness.engine.footprint import footprint, surely_fits

    suite = write_grid(tmp_path, "room")
    cell = cells_of(suite)[0]
    need = footprint(cell)
    # The quick bound from the plain backbone settles a roomy disk without building methods.
    assert surely_fits([cell], 2**40) and not surely_fits([cell], need.total)
    # width-4 digits_cnn: 4 bytes per parameter in the weights and as many in SGD's momentum
    assert need.checkpoint_bytes >= 2 * 4 * need.parameters
    with small_filesystem(tmp_path / "fs", "1m") as fs:
        fill(fs, leave=need.total // 2)
        rc = main(["validate", str(suite), "--results", str(fs)])
        out, err = capsys.readouterr()
        assert rc == 2, (out, err)
        assert re.fullmatch(
            rf"{re.escape(str(fs / 'room'))}: no space for one cell: [\d.]+ KiB free of 1\.0 MiB "
            rf"on its file system, and cell {re.escape(cell.label)} \({need.parameters:,} "
            r"parameters\) writes a [\d.]+ KiB checkpoint plus its record; free space or give "
            r"--results on a larger file system",
            err.strip(),
        ), err
        (fs / "ballast").unlink()
        assert main(["validate", str(suite), "--results", str(fs)]) == 0


def test_validate_refuses_a_pretrained_file_of_another_architecture(tmp_path, capsys):
    import torchvision

    foreign = tmp_path / "resnet18.pt"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), foreign)
    suite = tmp_path / "foreign.yaml"
    suite.write_text(
        write_grid(tmp_path, "foreign").read_text()
        .replace("methods: [single]", f"methods: [{{name: sigma_ens, hparams: "
                                      f"{{pretrained: {foreign}}}}}]")
    )  # fmt: skip
    rc = main(["validate", str(suite)])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"{suite}: grid.methods[0].hparams.pretrained: {foreign} does not fit the backbone: "
    ), line
    assert line.endswith("pick weights of the same architecture (digits_cnn on digits)"), line
    assert "Traceback" not in out + err


def test_pretrained_file_fitted_like_named_weights(tmp_path, caplog):
    """A file whose classifier has another shape keeps the seeded head (logged); one with the
    right names but no tensor of the backbone's shape is refused in one line, at validate and
    when the cell runs."""
    from harness.backbones._weights import WeightsError, file_fit_problem, fit_to_backbone
    from harness.registry import BACKBONES

    spec = BACKBONES.get("digits_cnn")

    def build(width: int = 4, classes: int = 10):
        return lambda: spec.build((1, 8, 8), classes, width=width)

    other_head = tmp_path / "head.pt"
    torch.save(build(classes=3)().state_dict(), other_head)
    assert file_fit_problem(other_head, build()) is None
    with caplog.at_level("WARNING"):
        state = fit_to_backbone(torch.load(other_head), build(), 0, str(other_head))
    assert "kept the backbone's own initialisation" in caplog.text
    assert set(state) == set(build()().state_dict())

    wider = tmp_path / "wide.pt"  # the same names, another width and head: no tensor fits
    torch.save(build(width=16, classes=3)().state_dict(), wider)
    problem = file_fit_problem(wider, build())
    assert problem is not None and problem.startswith(
        f"pretrained: {wider} does not fit the backbone: none of its "
    ), problem
    assert "has the backbone's shape (first: " in problem
    with pytest.raises(WeightsError, match=r"^pretrained: .* does not fit the backbone: none of"):
        fit_to_backbone(torch.load(wider), build(), 0, str(wider))


# ------------------------------------------------------------------------- slow: real faults


def harness_run(suite: Path, results: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
           "-q", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_real_full_file_system_with_local_workers(tmp_path):
    """The acceptance run: the results folder on a real 3 MiB tmpfs, 6 cells on 2 local
    workers. One cell has an epoch-1 checkpoint from an earlier (killed) run, one a record;
    the rest of the file system is filled so that the run passes the pre-flight check (one
    cell's checkpoint + record) but runs out within its first cells."""
    from harness.engine.footprint import footprint
    from harness.storage.checkpoint import load_checkpoint

    suite = write_grid(tmp_path, "tiny", seeds="[0, 1, 2, 3, 4, 5]", epochs=3)
    cells = cells_of(suite)
    need = footprint(cells[0]).total
    with small_filesystem(tmp_path / "fs", "3m") as fs:
        folder = fs / "tiny"
        done = harness_run(suite, fs, "--executor", "inprocess", "--only", "seed=0")
        assert done.returncode == 0, done.stderr
        killed = subprocess.run(
            [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(fs), "-q",
             "--executor", "inprocess", "--only", "seed=1"],
            capture_output=True, text=True, timeout=600,
            env=fault_env(dict(__import__("os").environ),
                          HARNESS_FAULT_KILL_WRITE="checkpoint.pt:2"),
        )  # fmt: skip
        assert killed.returncode == -9, killed.stderr
        before = snapshot(folder)
        assert len(before) == 2  # seed 0's record, seed 1's epoch-1 checkpoint
        fill(fs, leave=int(need * 1.3))
        run = harness_run(suite, fs, "--executor", "local", "--workers", "2", "--threads", "1")
        text = run.stdout + run.stderr
        assert run.returncode == 1, text
        assert "Traceback" not in text
        full = [x for x in text.splitlines() if "OutOfSpace" in x or "stopped starting" in x]
        assert full, text
        stop = next(x for x in text.splitlines() if x.startswith("stopped starting cells"))
        m = re.search(rf"failed: ({re.escape(str(folder))}/[0-9a-f]{{16}}/\S+): no space left on "
                      r"device: the file system is full \([\d.]+ (B|KiB) free of 3\.0 MiB\); "
                      r"(\d+) cells? left pending \(not started\)", stop)  # fmt: skip
        assert m, stop
        # Started: handed to a worker, by this run or an earlier one. Its folder is the mark
        # (the lease's mkdir, which a full tmpfs still allows), not events.jsonl: a cell handed
        # out in the race below may fail to write even its lease, and has no events.
        started = [c for c in cells if (folder / c.cell_id).is_dir()]
        assert int(m.group(3)) == len(cells) - len(started)
        # Nothing started after the executor learned of the first out-of-space failure (the one
        # the line names). The executor is not the clock: in the moment between the failing
        # worker writing its "failed" event and the executor reading its result, the other
        # worker may finish a cell and be handed the next one. So the guarantee, independent of
        # that interleaving, is: at most one start (workers - 1) after the failure's time, and
        # none after the run's stop line is printed (the pending count above).
        events = {c.cell_id: read_events(folder / c.cell_id) for c in started}
        hit = Path(m.group(1)).parent.name
        failed_at = min((e["at"] for e in events[hit] if e["event"] == "failed"), default=None)
        record = folder / hit / "record.json"
        if failed_at is None and record.exists():
            # The disk had no room for the failed line itself (record_failure logs it instead):
            # the record's finished_at (to the second) bounds the failure from above.
            finished = json.loads(record.read_text())["finished_at"]
            failed_at = datetime.fromisoformat(finished).timestamp() + 1
        if failed_at is not None:  # else neither fitted: the pending count above is the check
            late = [(c, e) for c, evs in events.items() for e in evs
                    if e["event"] == "train" and e["at"] > failed_at and c != hit]  # fmt: skip
            assert len(late) <= 1, late  # 2 workers: the other one's race, never more
        # What was on disk before the fault is never lost or made worse: a finished cell's
        # record is byte-identical; an earlier checkpoint is either the same file, replaced by
        # a whole checkpoint of a later epoch (its cell resumed and went on), or gone because
        # its cell finished. Which of the three depends on how fast the disk filled, so the
        # test accepts each and checks what each one promises.
        after = snapshot(folder)
        for path, data in before.items():
            cell = Path(path).parent.name
            if Path(path).name == "record.json":
                assert after[path] == data, path
            elif path not in after:
                assert statuses(folder).get(cell) == "done", path
            elif after[path] != data:
                then = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
                now = load_checkpoint(Path(path))
                assert now is not None and now["epoch"] > then["epoch"], path
        for path in folder.glob("*/checkpoint.pt"):
            assert load_checkpoint(path) is not None, path
        assert not list(folder.glob("*/.*.tmp"))
        # Where each unfinished cell stands before space is freed: the rerun resumes there.
        # A cell whose training was over (final.pt and trained.json whole) is only evaluated
        # again (None); any other resumes after its checkpoint's epoch, or trains from 0.
        resume_from: dict[str, int | None] = {}
        for c in cells:
            cell_dir = folder / c.cell_id
            if statuses(folder).get(c.cell_id) == "done":
                continue
            ckpt = load_checkpoint(cell_dir / "checkpoint.pt")
            trained = (cell_dir / "trained.json").exists() and (cell_dir / "final.pt").exists()
            resume_from[c.cell_id] = (
                None if trained else ckpt["epoch"] + 1 if ckpt is not None else 0
            )
        starts_before = {c: len(train_starts(folder / c)) for c in resume_from}
        print(text)

        (fs / "ballast").unlink()  # space freed
        rerun = harness_run(suite, fs, "--executor", "local", "--workers", "2", "--threads", "1")
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert statuses(folder) == dict.fromkeys([c.cell_id for c in cells], "done")
        # Each unfinished cell resumed from the checkpoint it had (seed 1: epoch 1 or later),
        # a finished one was not run again.
        for cell_id, epoch in resume_from.items():
            starts = train_starts(folder / cell_id)
            if epoch is None:  # evaluated again from its trained weights, not trained
                assert len(starts) == starts_before[cell_id], cell_id
                assert "evaluate_only" in [e["event"] for e in read_events(folder / cell_id)]
            else:
                assert starts[-1] == epoch, (cell_id, starts)
        assert resume_from.get(cells[1].cell_id) != 0  # seed 1 never went back to epoch 0
        assert (folder / cells[0].cell_id / "record.json").read_bytes() == before[
            str(folder / cells[0].cell_id / "record.json")
        ]


class _ReapedElsewhere:
    """A dead worker whose exit code another thread stores only after our first join: what
    happens when the pool's manager thread reaps it first (our waitpid gets ECHILD)."""

    pid = 4111

    def __init__(self) -> None:
        self.exitcode: int | None = None
        self.joins = 0

    def join(self, timeout: float | None = None) -> None:
        self.joins += 1
        if self.joins == 2:
            self.exitcode = -9


def test_the_killing_signal_is_read_even_when_the_pool_reaped_the_worker_first():
    from harness.executors.faults import signal_name
    from harness.executors.local import dead_worker_exit_code

    proc = _ReapedElsewhere()
    assert signal_name(dead_worker_exit_code(proc)) == "SIGKILL"
    assert proc.joins == 2

    never = _ReapedElsewhere()
    never.join = lambda timeout=None: None  # the code never arrives: unknown, after the wait
    assert dead_worker_exit_code(never, timeout=0.3) is None


@pytest.mark.slow
def test_sigkilled_worker_is_replaced_and_a_cell_that_kills_twice_is_failed(tmp_path):
    from harness.executors.base import ExecutorOptions
    from harness.executors.local import LocalWorkersExecutor
    from tests.fixtures.machine_faults import killing_task

    cells = cells_of(write_grid(tmp_path, "kill", seeds="[0, 1, 2, 3]", epochs=3))
    once, always = cells[0].cell_id, cells[1].cell_id
    write_kill_plan(tmp_path, {once: "once", always: "always"})
    executor = LocalWorkersExecutor(
        ExecutorOptions(workers=2, threads=1, progress=False), task=killing_task
    )
    outcome = executor.run(cells, tmp_path / "kill", None, force=False)
    folder = tmp_path / "kill"
    by_id = {r["cell_id"]: r for r in outcome.records}
    assert set(by_id) == {c.cell_id for c in cells}
    assert {c: r["status"] for c, r in by_id.items()} == {
        once: "done", always: "failed", cells[2].cell_id: "done", cells[3].cell_id: "done"
    }  # fmt: skip
    # The cell killed once: a new worker, resumed from the first attempt's checkpoint.
    pids = attempts(tmp_path, once)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert train_starts(folder / once) == [0, 1]  # killed right after its epoch-1 checkpoint
    killed_line = next(m for m in outcome.messages if m.startswith(f"cell {once} "))
    assert f"(pid {pids[0]}) was killed by SIGKILL" in killed_line
    assert "a new worker took its place and retried the cell" in killed_line
    # The cell that kills every worker: started exactly twice (the retry from the first
    # attempt's checkpoint), then failed with a record.
    assert len(attempts(tmp_path, always)) == 2
    assert train_starts(folder / always) == [0, 1]
    rec = json.loads((folder / always / "record.json").read_text())
    assert rec["status"] == "failed" and rec["error"]["type"] == "WorkerKilled"
    assert rec["error"]["message"].startswith(
        f"cell {always} ({rec['label']}) killed its worker process 2 times (last by SIGKILL: "
    )
    assert rec["error"]["message"] in outcome.messages
    assert not outcome.halted
