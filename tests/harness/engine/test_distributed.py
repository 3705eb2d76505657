"""Cells that span several processes (harness.engine.distributed): DDP on the CPU with gloo.

* A 2-process cell of a method without batch statistics (deep ensemble on a LayerNorm MLP, a
  test backbone registered through the plugin mechanism) gives the one-process cell's history
  and metrics within float tolerance.
* σN-Ens's per-member BatchNorm statistics are per rank: one DDP step's gradient is exactly the
  mean of the one-process gradients of the ranks' blocks, each normalised on its own, and not
  the full batch's gradient; a 2-process σN-Ens cell therefore differs from the one-process one
  (slightly: same data, same model, statistics over B/2 instead of B images).
* A DDP cell whose launcher is SIGKILLed after a checkpoint resumes on both ranks and ends with
  one record, equal to the one-process metrics, and events.jsonl shows the resume.
* On the local Slurm cluster a 2-task cell runs through submitit and writes one record.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from harness.config.parse import load_suite
from harness.contract import Cell, Evaluation, Recipe
from harness.registry.core import PLUGINS_ENV
from harness.storage.checkpoint import read_events
from harness.storage.lease import pid_alive, read_owner
from tests.fixtures.machine_faults import fault_env

REPO = Path(__file__).resolve().parents[3]
PLUGIN = "ddp_test_backbone"
PLUGIN_SOURCE = '''
"""A LayerNorm MLP: a backbone without batch statistics, for the DDP equality test."""
from torch import nn

from harness.backbones import BackboneSpec, register_backbone


def build(in_shape, num_classes, width: int = 32, dropout_rate: float = 0.0, **kw):
    c, h, w = in_shape
    return nn.Sequential(
        nn.Flatten(), nn.Linear(c * h * w, width), nn.LayerNorm(width), nn.ReLU(),
        nn.Dropout(dropout_rate), nn.Linear(width, num_classes),
    )


register_backbone(BackboneSpec("ln_mlp", build, "mlp", "test MLP with LayerNorm"))
'''

SUITE = """
name: ddp
grid:
  datasets: [digits]
  backbones: [{backbone}]
  seeds: [0]
  methods: [{{name: {method}, M: [2]}}]
recipe: {{epochs: {epochs}, batch_size: 64, lr: 0.05, processes: {processes}}}
evaluation: {{cost: false}}
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plugin")
    (folder / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    return folder


@pytest.fixture
def with_plugin(plugin_dir, monkeypatch) -> Path:
    """The test backbone importable here and in spawned ranks (sys.path and $HARNESS_PLUGINS
    are what a spawned process inherits)."""
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv(PLUGINS_ENV, PLUGIN)
    from harness.registry.core import load_plugins

    load_plugins([PLUGIN])
    return plugin_dir


def write_suite(folder: Path, method: str, backbone: str, epochs: int, processes: int) -> Path:
    path = folder / f"{method}-{processes}.yaml"
    path.write_text(
        textwrap.dedent(SUITE).format(
            method=method, backbone=backbone, epochs=epochs, processes=processes
        )
    )
    return path


def only_cell(path: Path) -> Cell:
    cells = load_suite(path).cells()
    assert len(cells) == 1
    return cells[0]


def run(cell: Cell, results: Path) -> dict:
    """The cell as an executor runs it: its ranks started here (harness.executors.ranks)."""
    from harness.executors.ranks import run_one

    torch.set_num_threads(1)
    return run_one(cell, results, progress=False)


def processes(cell: Cell, n: int) -> Cell:
    return dataclasses.replace(cell, recipe=dataclasses.replace(cell.recipe, processes=n))


def close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def assert_written_once(cell_dir: Path) -> list[dict]:
    """One record, rank 0's events only, no lease left; returns the events."""
    events = read_events(cell_dir)
    names = [e["event"] for e in events]
    assert names.count("done") == 1 and names.count("trained") == 1, names
    # Rank 0 wrote them: the process that finished training is the one that wrote the record.
    assert len({e["pid"] for e in events if e["event"] in ("trained", "done")}) == 1
    assert all(e.get("processes") == 2 for e in events if e["event"] == "train"), events
    assert not (cell_dir / "lease.json").exists()
    return events


# ------------------------------------------------------------------ equality and the BN difference


@pytest.fixture(scope="module")
def mlp_reference(tmp_path_factory, plugin_dir) -> dict:
    """The one-process deep-ensemble record the 2-process runs are compared with (3 epochs)."""
    tmp = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(plugin_dir))
        mp.setenv(PLUGINS_ENV, PLUGIN)
        from harness.registry.core import load_plugins

        load_plugins([PLUGIN])
        cell = only_cell(write_suite(tmp, "deep_ensemble", "ln_mlp", 3, 1))
        rec = run(cell, tmp / "results")
    assert rec["status"] == "done", rec.get("error")
    return rec


def show(what: str, one: dict, two: dict) -> None:
    """The compared numbers, for ``pytest -s`` (quoted in docs/distributed.md)."""
    losses = [[f"{h['train_loss']:.8f}" for h in r["history"]] for r in (one, two)]
    clean = [{k: f"{r['metrics']['clean'][k]:.8f}" for k in ("acc", "nll")} for r in (one, two)]
    print(f"\n{what}: 1 process loss {losses[0]} {clean[0]}; 2 processes {losses[1]} {clean[1]}")


def assert_same_numbers(one: dict, two: dict) -> None:
    for h1, h2 in zip(one["history"], two["history"], strict=True):
        for key in ("train_loss", "train_acc", "lr"):
            assert close(h1[key], h2[key]), (key, h1[key], h2[key])
    for key in ("acc", "nll", "ece", "brier"):
        if key in one["metrics"]["clean"]:
            a, b = one["metrics"]["clean"][key], two["metrics"]["clean"][key]
            assert close(a, b, 1e-4), (key, a, b)


@pytest.mark.slow
def test_two_process_cell_equals_one_process_cell(tmp_path, with_plugin, mlp_reference):
    cell = only_cell(write_suite(tmp_path, "deep_ensemble", "ln_mlp", 3, 2))
    assert cell.cell_id != mlp_reference["cell_id"]  # processes > 1 is part of the identity
    assert cell.label == processes(cell, 1).label
    rec = run(cell, tmp_path / "results")
    assert rec["status"] == "done", rec.get("error")
    assert rec["config"]["recipe"]["processes"] == 2
    show("deep ensemble M=2, LayerNorm MLP", mlp_reference, rec)
    assert_same_numbers(mlp_reference, rec)
    assert_written_once(tmp_path / "results" / cell.cell_id)
    assert not (tmp_path / "results" / cell.cell_id / "checkpoint.pt").exists()


def test_batch_size_must_divide_over_processes(tmp_path, capsys):
    from harness.cli import main
    from harness.config.validator import recipe_problems

    (problem,) = recipe_problems(Recipe(batch_size=65, processes=2), "recipe")
    assert str(problem) == (
        "recipe.batch_size: 65 is not divisible by processes 2: every process trains on an "
        "equal block of the global batch"
    )
    assert recipe_problems(Recipe(batch_size=64, processes=2), "recipe") == []
    suite = tmp_path / "s.yaml"  # a suite's recipe: one line at validate, nothing trains
    suite.write_text(
        "name: s\ngrid: {datasets: [digits], backbones: [digits_cnn], methods: [single]}\n"
        "recipe: {batch_size: 10, processes: 4}\n"
    )
    assert main(["validate", str(suite)]) == 2
    err = capsys.readouterr().err
    assert "recipe.batch_size: 10 is not divisible by processes 4" in err, err


def sigma_cell() -> Cell:
    return Cell(
        "ddp", "digits", "digits_cnn", {"width": 4}, "sigma_ens", 2, {}, 0, Recipe(), Evaluation()
    )


def sigma_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 8, (16,), generator=g)


def sigma_step_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of one σN-Ens DDP training step on its block of a fixed batch (spawned)."""
    import torch.distributed as dist

    from harness.engine.build import build_model
    from harness.engine.distributed import DistributedTraining
    from harness.engine.train import ensemble_loss

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ["WORLD_SIZE"] = str(world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    cell = sigma_cell()
    from harness.registry import DATASETS

    model, _ = build_model(cell, DATASETS.get("digits"))
    x, y = sigma_batch()
    block = slice(rank * 16 // world, (rank + 1) * 16 // world)
    trainee = DistributedTraining(model, torch.device("cpu"))
    trainee.train()
    loss, _, _ = ensemble_loss(trainee, x[block], y[block], cell.recipe)
    loss.backward()
    if rank == 0:
        torch.save({n: p.grad for n, p in model.named_parameters()}, out)
    # The DDP wrapper freed and both ranks past every collective before the group goes (see
    # every_method_rank: a wrapper left alive until interpreter exit aborted the process there).
    del trainee, loss
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def one_process_grads(blocks: list[slice]) -> dict[str, torch.Tensor]:
    """Mean over ``blocks`` of the one-process gradient of each block trained on alone."""
    from harness.engine.build import build_model
    from harness.engine.train import ensemble_loss
    from harness.registry import DATASETS

    cell = sigma_cell()
    model, _ = build_model(cell, DATASETS.get("digits"))
    model.train()
    x, y = sigma_batch()
    total: dict[str, torch.Tensor] = {}
    for block in blocks:
        model.zero_grad()
        loss, _, _ = ensemble_loss(model, x[block], y[block], cell.recipe)
        loss.backward()
        for n, p in model.named_parameters():
            total[n] = total.get(n, 0) + p.grad / len(blocks)
    return total


@pytest.mark.slow
def test_sigma_ens_batch_statistics_are_per_rank(tmp_path):
    """The documented difference: each rank normalises its B/2 images with their own
    per-member statistics, so a step is the mean of the blocks' one-process steps."""
    from harness.executors.ranks import free_port

    out = tmp_path / "grads.pt"
    torch.multiprocessing.spawn(sigma_step_rank, args=(2, free_port(), str(out)), nprocs=2)
    ddp = torch.load(out)
    per_rank = one_process_grads([slice(0, 8), slice(8, 16)])
    full = one_process_grads([slice(0, 16)])
    assert ddp.keys() == per_rank.keys()
    for name, grad in ddp.items():
        assert torch.allclose(grad, per_rank[name], rtol=1e-4, atol=1e-6), name
    gap = max((ddp[n] - full[n]).abs().max().item() for n in ddp)
    assert gap > 1e-3  # not the full batch's statistics: the numbers do change


@pytest.mark.slow
def test_sigma_ens_cell_differs_slightly_from_one_process(tmp_path):
    one = only_cell(write_suite(tmp_path, "sigma_ens", "{name: digits_cnn, kwargs: {width: 4}}",
                                1, 1))  # fmt: skip
    two = processes(one, 2)
    r1, r2 = run(one, tmp_path / "results"), run(two, tmp_path / "results")
    assert r1["status"] == r2["status"] == "done", (r1.get("error"), r2.get("error"))
    show("σN-Ens M=2, digits CNN (BatchNorm)", r1, r2)
    l1, l2 = r1["history"][0]["train_loss"], r2["history"][0]["train_loss"]
    assert not close(l1, l2, 1e-4)  # per-rank batch statistics
    assert abs(l1 - l2) < 0.05 * l1  # the same method on the same data: close
    # Every member's running statistics were averaged over the ranks into one (M, C) set.
    final = torch.load(tmp_path / "results" / two.cell_id / "final.pt")
    running = [v for k, v in final.items() if k.endswith("running_mean")]
    assert running and all(v.shape[0] == 2 and torch.isfinite(v).all() for v in running)
    assert_written_once(tmp_path / "results" / two.cell_id)


def every_method_rank(rank: int, world: int, port: int, out: str) -> None:
    """Two DDP training steps of every registered method on the digits CNN (spawned rank):
    DDP reduces every parameter's gradient each step (an unused parameter, or a method whose
    training step bypasses the wrapped forward, fails at the second step), and the replicas
    stay identical. Rank 0 writes {method: max |p_rank0 - p_rank1|}."""
    import torch.distributed as dist

    from harness.data._machinery.base import default_data_root
    from harness.engine.build import build_model, load_data
    from harness.engine.cell_setup import train_loader
    from harness.engine.distributed import DistributedTraining
    from harness.engine.train import ensemble_loss, make_optimizer
    from harness.registry import DATASETS, METHODS

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ["WORLD_SIZE"] = str(world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    gaps = {}
    for name in METHODS.names():
        spec = METHODS.get(name)
        if spec.backbones is not None and "digits_cnn" not in spec.backbones:
            continue
        m = spec.max_members if spec.max_members == 1 else max(spec.min_members, 2)
        cell = dataclasses.replace(
            sigma_cell(),
            method=name,
            M=m,
            backbone_kwargs={"width": 16},  # Masksembles: >= 10
        )
        _, splits = load_data(cell, default_data_root(None))  # digits is built in
        model, _ = build_model(cell, DATASETS.get("digits"))
        trainee = DistributedTraining(model, torch.device("cpu"))
        trainee.train()
        opt = make_optimizer(model, cell.recipe)
        loader = train_loader(
            cell, DATASETS.get("digits"), splits["train"], torch.device("cpu"), (rank, world)
        )
        for _step, (x, y) in zip(range(2), loader):
            loss, _, _ = ensemble_loss(trainee, x, y, cell.recipe)
            opt.zero_grad()
            loss.backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        other = flat.clone()
        dist.broadcast(other, src=1)
        gaps[name] = (flat - other).abs().max().item()
        # Each method's DDP wrapper freed before the next is built, and both ranks past every
        # collective before the group goes: with the wrappers left alive until interpreter exit,
        # one rank in three died there with SIGABRT ("terminate called without an active
        # exception", no Python frame) after all its work was done (0 in 15 runs like this).
        # Seen on an Intel Xeon machine with torch 2.14.1 and gloo, not on the AMD one before.
        del trainee, model, opt, loader
        gc.collect()
    if rank == 0:
        Path(out).write_text(json.dumps(gaps))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_method_trains_through_ddp_with_identical_replicas(tmp_path):
    from harness.executors.ranks import free_port

    out = tmp_path / "gaps.json"
    torch.multiprocessing.spawn(every_method_rank, args=(2, free_port(), str(out)), nprocs=2)
    gaps = json.loads(out.read_text())
    assert {"single", "deep_ensemble", "sigma_ens", "mc_dropout", "batch_ensemble"} <= set(gaps)
    assert gaps == {name: 0.0 for name in gaps}


# ------------------------------------------------------------------ kill and resume


def cli_env(plugin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_FAULT")}
    path = os.pathsep.join([str(plugin_dir), str(REPO)])
    return {**env, "PYTHONPATH": path, PLUGINS_ENV: PLUGIN, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_killed_ddp_cell_resumes_on_both_ranks(tmp_path, plugin_dir, mlp_reference):
    suite = write_suite(tmp_path, "deep_ensemble", "ln_mlp", 3, 2)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--results", str(results),
           "-q", "--executor", "inprocess"]  # fmt: skip
    # Every atomic write sleeps 1 s: the launcher is killed between two epoch checkpoints.
    stderr = (tmp_path / "stderr.txt").open("w")
    env = fault_env(cli_env(plugin_dir), HARNESS_FAULT_WRITE_SLEEP_S="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    folder = results / "ddp"
    deadline = time.monotonic() + 300
    while not list(folder.glob("*/checkpoint.pt")):
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.1)
    cell_dir = next(folder.glob("*/checkpoint.pt")).parent
    owner = read_owner(cell_dir)
    proc.send_signal(signal.SIGKILL)  # the launcher only: its ranks must notice and stop
    proc.wait()
    assert owner is not None and owner["pid"] != proc.pid  # rank 0 held the lease
    deadline = time.monotonic() + 30
    while pid_alive(owner["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(owner["pid"]), "rank 0 outlived its launcher"
    assert not (cell_dir / "record.json").exists()

    out = subprocess.run(cmd, env=cli_env(plugin_dir), capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((cell_dir / "record.json").read_text())
    assert rec["status"] == "done"
    starts = [e["from_epoch"] for e in read_events(cell_dir) if e["event"] == "train"]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= 1, starts
    assert_same_numbers(mlp_reference, rec)
    assert_written_once(cell_dir)
    assert [len(rec["history"])] == [3]


# ------------------------------------------------------------------ Slurm


@pytest.mark.slurm
def test_two_task_cell_runs_through_submitit(slurm_env, tmp_path):
    """One array task of two Slurm tasks (tasks_per_node=2, one CPU each on the 2-CPU node):
    both ranks train, rank 0 writes the one record."""
    suite = write_suite(tmp_path, "deep_ensemble", "{name: digits_cnn, kwargs: {width: 4}}", 2, 2)
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(suite), "--executor", "slurm",
           "--profile", "local", "--wait", "-q", "--results", str(results)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    folder = results / "ddp"
    recs = [json.loads(p.read_text()) for p in folder.glob("*/record.json")]
    assert len(recs) == 1 and recs[0]["status"] == "done", [r.get("error") for r in recs]
    cell_dir = folder / recs[0]["cell_id"]
    events = assert_written_once(cell_dir)
    assert {e["event"] for e in events} >= {"train", "trained", "done"}
    script = next((folder / "_slurm").rglob("*_submission.sh")).read_text()
    assert "--ntasks-per-node=2" in script
    # Both tasks ran the cell: submitit keeps one result per task (our own pickles, written by
    # the tasks): rank 0 returned the record's status, rank 1 that it trained.
    outcomes = {}
    for path in (folder / "_slurm").rglob("*_result.pkl"):
        with path.open("rb") as f:
            outcomes[path.name.rsplit("_", 2)[-2]] = pickle.load(f)
    assert outcomes == {
        "0": ("success", {"cell_id": cell_dir.name, "status": "done"}),
        "1": ("success", {"cell_id": cell_dir.name, "status": "trained"}),
    }


def test_cuda_cell_without_enough_gpus_fails_with_a_record(tmp_path, monkeypatch):
    """NCCL refuses two ranks on one GPU: a cell asking for more GPUs than the process sees
    gets a failed record saying so, and the grid goes on."""
    from harness.contract.record import validate_record

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cell = processes(sigma_cell(), 2)
    cell = dataclasses.replace(cell, recipe=dataclasses.replace(cell.recipe, device="cuda"))
    rec = run(cell, tmp_path)
    validate_record(rec)
    assert rec["status"] == "failed" and rec["error"]["phase"] == "setup"
    assert rec["error"]["message"].endswith(
        "needs 2 GPUs (recipe processes: 2), this process sees 1 (0); run it with --executor "
        "inprocess on a machine with 2 GPUs, or on Slurm"
    )
    assert json.loads((tmp_path / cell.cell_id / "record.json").read_text()) == rec
    assert not (tmp_path / cell.cell_id / "lease.json").exists()


def test_one_process_cells_keep_their_config_and_id():
    """`processes: 1` is how every cell ran before the field: it is left out of the cell id (so
    ids are unchanged, and reports group old and new records) but spelled out in the config the
    cell and its record carry (nothing dropped for a reader to refill); more processes are
    part of both."""
    one = sigma_cell()
    two = processes(one, 2)
    assert "processes" not in one.identity_config()["recipe"]
    assert one.config()["recipe"]["processes"] == 1
    assert two.config()["recipe"]["processes"] == 2
    assert two.identity_config()["recipe"]["processes"] == 2
    assert one.cell_id != two.cell_id
    assert Cell.from_json(one.to_json()) == one and Cell.from_json(two.to_json()) == two
    for validated in (False, True):  # read back from disk, or handed to a worker
        assert Cell.from_json(one.to_json(), validated) == one
    legacy = one.to_json()
    del legacy["recipe"]["processes"]  # a cell.json written before the field
    assert Cell.from_json(legacy).cell_id == one.cell_id
    assert Cell.from_json(legacy, validated=True).cell_id == one.cell_id
