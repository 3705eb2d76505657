"""``harness bench --loop real``: the real training loop next to the synthetic step, the ratio
column, the JSON rows and the Markdown fragment of benchmarks/gpu_check.sh. Values are checked
for consistency (ratios are the quotients of the columns), never against a wall-time bar."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from harness.cli import build_parser
from harness.cli import main as cli_main
from harness.cli.bench import REAL_COLUMNS, format_rows, run_bench
from harness.config.suite import expand_hparams
from harness.contract.config import Recipe
from harness.engine.cost import FirstBatches, real_loop_throughput, synthetic_images
from harness.registry import METHODS
from methods._base import BuildContext
from tests.conftest import REPO

CPU = torch.device("cpu")
TINY = dict(
    backbone="digits_cnn",
    m=2,
    batch=4,
    image_size=8,
    classes=5,
    steps=2,
    warmup=1,
    compile_model=False,
    device=CPU,
)


def load_markdown_module():
    spec = importlib.util.spec_from_file_location(
        "bench_markdown", REPO / "benchmarks" / "bench_markdown.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def real_result():
    # the deep ensemble trains on one batch per member (independent data): the real loop's
    # loader must draw them as the runner's does
    return run_bench(methods=[("sigma_ens", {}), ("deep_ensemble", {})], loop="real", **TINY)


@pytest.mark.slow
def test_real_loop_rows_have_the_ratio_column(real_result):
    assert real_result["config"]["loop"] == "real"
    rows = real_result["rows"]
    assert [r["method"] for r in rows] == ["single", "single", "sigma_ens", "deep_ensemble"]
    assert [r["real_streams"] for r in rows] == [1, 1, 1, 2]
    for r in rows:
        assert "error" not in r, r
        assert r["real_train_images_per_s"] > 0
        assert r["real_ratio_to_synthetic"] == pytest.approx(
            r["real_train_images_per_s"] / r["train_images_per_s"]
        )
        assert r["real_peak_train_mem_mib"] is None  # no accelerator memory on a CPU
        assert r["real_train_loss"] > 0
    table = format_rows(real_result)
    for header, _, _ in REAL_COLUMNS:
        assert header in table.splitlines()[0]
    sigma_line = next(line for line in table.splitlines() if line.startswith("sigma_ens"))
    assert f"{rows[2]['real_ratio_to_synthetic']:.3f}" in sigma_line


def test_synthetic_loop_has_no_real_columns():
    res = run_bench(methods=[], loop="synthetic", **{**TINY, "steps": 1})
    assert res["config"]["loop"] == "synthetic"
    assert all("real_train_images_per_s" not in r for r in res["rows"])
    assert "real/synth" not in format_rows(res)


def test_unknown_loop_is_refused():
    with pytest.raises(ValueError, match="loop must be one of"):
        run_bench(methods=[], loop="fast", **TINY)


def test_real_loop_restores_the_weights():
    spec = METHODS.get("sigma_ens")
    torch.manual_seed(0)
    model = spec.build(
        BuildContext("digits_cnn", (1, 8, 8), 5, 2), spec.hparams(**expand_hparams(spec, {})[0])
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = real_loop_throughput(model, Recipe(), CPU, 4, (1, 8, 8), 5, steps=2, warmup=1)
    assert out["real_train_images_per_s"] > 0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], msg=k)


def test_first_batches_takes_a_prefix_and_refuses_too_many():
    from harness.data._machinery.loader import DeviceLoader

    data = synthetic_images(12, (1, 8, 8), 3)
    assert data.images.dtype == torch.uint8 and int(data.labels.max()) < 3
    loader = DeviceLoader(data, 4, CPU, (0.5,), (0.25,))
    first = FirstBatches(loader, 2)
    assert len(first) == 2
    batches = list(first)
    assert len(batches) == 2
    torch.testing.assert_close(batches[1][1], data.labels[4:8])
    with pytest.raises(ValueError, match="asked for 4 batches of a loader that has 3"):
        FirstBatches(loader, 4)


def test_markdown_fragment_has_every_row_and_an_m_scaling_table(real_result, tmp_path):
    md = load_markdown_module()
    other = json.loads(json.dumps(real_result))
    other["config"]["M"] = 4
    paths = []
    for name, res in (("a.json", real_result), ("b.json", other)):
        (tmp_path / name).write_text(json.dumps(res))
        paths.append(tmp_path / name)
    text = md.fragment(paths)
    assert "### digits_cnn, B=4, M=2, eager, 8×8, K=5, loop=real" in text
    assert "| row | train img/s | eval img/s |" in text and "| real/synth |" in text
    ratio = real_result["rows"][2]["real_ratio_to_synthetic"]
    assert "| sigma_ens | " in text and f"{ratio:.3f} |" in text
    assert "### M scaling: digits_cnn, eager" in text
    assert "| method | M=2 | M=4 |" in text
    assert md.main([]) == 2


@pytest.mark.slow
def test_cli_accepts_loop_real(tmp_path, capsys):
    args = build_parser().parse_args(["bench", "--loop", "real"])
    assert args.loop == "real"
    assert build_parser().parse_args(["bench"]).loop == "synthetic"
    out = tmp_path / "bench.json"
    rc = cli_main(
        [
            "bench",
            "--backbone",
            "digits_cnn",
            "--image-size",
            "8",
            "--classes",
            "4",
            "--M",
            "2",
            "--batch",
            "4",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--loop",
            "real",
            "--methods",
            "mc_dropout",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "loop=real" in printed and "real/synth" in printed
    rows = json.loads(out.read_text())["rows"]
    assert rows[-1]["method"] == "mc_dropout" and rows[-1]["real_train_images_per_s"] > 0


def test_killed_bench_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """The JSON is rewritten after every row: a kill (here Ctrl-C in the third row) keeps the
    two plain-backbone rows already measured."""
    from harness.cli import bench

    real, calls = bench.bench_one, {"n": 0}

    def killed_in_third_row(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("time limit")
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "bench_one", killed_in_third_row)
    out = tmp_path / "bench.json"
    argv = ["bench", "--backbone", "digits_cnn", "--image-size", "8", "--classes", "4"]
    argv += ["--M", "2", "--batch", "4", "--steps", "1", "--warmup", "0", "-o", str(out)]
    assert cli_main([*argv, "--methods", "sigma_ens"]) == 130  # the CLI's Ctrl-C exit
    kept = json.loads(out.read_text())
    assert kept["complete"] is False
    assert [r["M"] for r in kept["rows"]] == [1, 1]
    assert kept["rows"][1]["bound_train_images_per_s"] > 0


@pytest.mark.slow
def test_real_loop_times_every_phase_of_a_cells_epoch(real_result):
    """The real loop also times what the rest of a cell's epoch costs: L_div's part of a step
    (σN-Ens only: the deep ensemble has no regulariser), the method's diagnostics, the
    evaluation; the phase table and the epoch estimate are their sums."""
    from harness.cli.bench import epoch_estimate, format_phases

    rows = {r["label"].split(" ")[0]: r for r in real_result["rows"]}
    sigma, deep = rows["sigma_ens"], rows["deep_ensemble"]
    assert sigma["real_regulariser_ms"] is not None and deep["real_regulariser_ms"] is None
    for r in (sigma, deep):
        assert r["real_step_ms"] == pytest.approx(
            TINY["batch"] / r["real_train_images_per_s"] * 1e3
        )
        assert r["real_diagnostics_s"] >= 0 and r["real_eval_ms_per_1k"] > 0
    want = 10 * sigma["real_step_ms"] / 1e3 + sigma["real_diagnostics_s"]
    want += 500 * sigma["real_eval_ms_per_1k"] / 1e6
    assert epoch_estimate(sigma, 10, 500) == pytest.approx(want)
    table = format_phases(real_result, 10, 500).splitlines()
    assert "epoch s (10 st, 500 val)" in table[0]
    line = next(t for t in table if t.startswith("sigma_ens"))
    bound = next(r for r in real_result["rows"] if "bound_train_images_per_s" in r)
    assert f"{want / epoch_estimate(bound, 10, 500):.3f}" in line


def test_bound_row_prints_the_divided_figure_its_label_names():
    res = run_bench(methods=[], loop="synthetic", **{**TINY, "steps": 1})
    bound = res["rows"][1]
    assert bound["label"].endswith("bound ÷ M")
    assert bound["train_images_per_s"] == pytest.approx(bound["mb_train_images_per_s"] / TINY["m"])
    assert bound["eval_images_per_s"] == pytest.approx(bound["mb_eval_images_per_s"] / TINY["m"])
    line = format_rows(res).splitlines()[2]
    assert (
        f"{bound['train_images_per_s']:,.0f}" in line
        or f"{bound['train_images_per_s']:.2g}" in line
    )


def test_every_bench_flag_says_what_it_does():
    parser = build_parser()
    bench = next(
        a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "bench"
    )[1]
    for action in bench._actions:
        assert action.help, f"harness bench {action.option_strings} has no help"


def test_channels_flag_sets_the_input_and_is_checked(capsys):
    res = run_bench(
        methods=[],
        loop="synthetic",
        channels=1,
        **{**TINY, "backbone": "fmnist_cnn", "image_size": 28, "steps": 1},
    )
    assert res["config"]["channels"] == 1
    with pytest.raises(SystemExit, match=r"^2$"):
        build_parser().parse_args(["bench", "--channels", "0"])
    assert "--channels" in capsys.readouterr().err


def test_augment_flag_reaches_the_real_loop_and_refuses_unknown_values(capsys):
    res = run_bench(methods=[], loop="real", augment="none", **{**TINY, "steps": 1})
    assert res["config"]["augment"] == "none"
    with pytest.raises(SystemExit, match=r"^2$"):
        build_parser().parse_args(["bench", "--augment", "cutout"])
    assert "invalid choice: 'cutout'" in capsys.readouterr().err


def test_an_epoch_estimate_without_the_real_loop_is_refused(capsys):
    code = cli_main(["bench", "--epoch-steps", "78", "--device", "cpu", "-o", "unused.json"])
    assert code == 2
    assert "--epoch-steps needs --loop real" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["dir", "under_a_file", "empty"])
def test_output_path_is_checked_before_anything_is_measured(tmp_path, capsys, where):
    afile = tmp_path / "afile"
    afile.write_text("")
    target = {"dir": str(tmp_path), "under_a_file": str(afile / "x.json"), "empty": ""}[where]
    assert cli_main(["bench", "--device", "cpu", "-o", target]) == 2
    err = capsys.readouterr().err
    assert "harness bench: error: -o" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--augment", "none"], "--augment need --loop real"),
        (["--val-images", "50"], "--val-images need --loop real"),
        (["--loop", "real", "--epoch-val", "100"], "--epoch-val needs --epoch-steps"),
    ],
)
def test_real_loop_flags_are_not_ignored_silently(flags, message, capsys, tmp_path):
    code = cli_main(["bench", "--device", "cpu", *flags, "-o", str(tmp_path / "x.json")])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
