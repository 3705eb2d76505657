"""benchmarks/gpu_check.sh's time budget and its one table (benchmarks/gpu_table.py), on
fabricated part outputs; the script itself runs in CI at SMALL=1 (.ci/run)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _table_module():
    spec = importlib.util.spec_from_file_location("gpu_table", REPO / "benchmarks" / "gpu_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_part_budgets_add_up_to_at_most_480_seconds():
    text = SCRIPT.read_text()
    budgets = [int(b) for b in re.findall(r"\bpart \S+ (\d+) ", text)]
    table = [
        int(b) for b in re.findall(r"^timeout (\d+) python benchmarks/gpu_table.py", text, re.M)
    ]
    assert len(budgets) == 8 and len(table) == 1  # every part has a budget, and the table one
    assert sum(budgets) + table[0] <= 480
    # the header's stated budgets are the ones the script uses
    header = dict(re.findall(r"^#\s+(\w+)\s+(\d+)\s", text, re.M))
    assert sum(int(v) for v in header.values()) == sum(budgets) + table[0]


def _bench(backbone, sigma_real, bound_real, sigma_eval_ratio, mem=None):
    bound = {
        "bound_train_images_per_s": 1.0,
        "real_train_images_per_s": bound_real,
        "real_peak_train_mem_mib": 100.0 if mem else None,
    }
    sigma = {
        "method": "sigma_ens",
        "real_train_images_per_s": sigma_real,
        "eval_ratio_to_bound": sigma_eval_ratio,
        "real_peak_train_mem_mib": mem,
    }
    return {"config": {"backbone": backbone}, "rows": [{"method": "single"}, bound, sigma]}


def test_table_reads_the_real_loop_ratios_and_the_recapture_check(tmp_path):
    mod = _table_module()
    (tmp_path / "resnet18_eager.json").write_text(
        json.dumps(_bench("resnet18", 900, 1000, 0.95, 105))
    )
    (tmp_path / "resnet18_graphed.json").write_text(json.dumps(_bench("resnet18", 990, 1100, 1.0)))
    (tmp_path / "kernels.json").write_text(
        json.dumps(
            {
                "backbone": "resnet18",
                "device": "cuda",
                "rows": [
                    {"method": "single", "per_step": 401, "counts": "device kernels"},
                    {"method": "sigma_ens", "per_step": 512.0, "counts": "device kernels"},
                ],
            }
        )
    )
    (tmp_path / "cell").mkdir()
    (tmp_path / "cell" / "cell.json").write_text(
        json.dumps(
            {"device": "cuda:0 NVIDIA H100", "step_modes": ["graphed", "eager"], "error": None}
        )
    )
    text = mod.table(tmp_path)
    lines = text.splitlines()
    assert "| resnet18 | eager | 0.90 | 0.95 | 1.05 | - | 512 (401) |" in lines
    assert "| resnet18 | graphed | 0.90 | 1.00 | - | - | - |" in lines
    assert not any("compiled" in line for line in lines)  # a part that wrote nothing: no row
    assert "NOT graphed in epoch 2" in text
    (tmp_path / "cell" / "cell.json").write_text(
        json.dumps(
            {"device": "cuda:0 NVIDIA H100", "step_modes": ["graphed", "graphed"], "error": None}
        )
    )
    assert "— graphed in epoch 2" in mod.table(tmp_path)


def test_table_refuses_a_missing_folder(tmp_path, capsys):
    mod = _table_module()
    assert mod.main([str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert mod.main([]) == 2


@pytest.mark.parametrize("broken", ["{not json", ""])
def test_table_skips_a_part_whose_json_is_damaged(tmp_path, broken):
    mod = _table_module()
    (tmp_path / "resnet18_eager.json").write_text(broken)
    assert mod.table(tmp_path).count("\n") == 1  # the header only


def test_a_graphed_row_whose_steps_ran_eagerly_says_so(tmp_path):
    mod = _table_module()
    bench = _bench("resnet18", 900, 1000, 0.95)
    bench["rows"][2]["real_step_mode"] = "eager"  # the capture failed, or no CUDA device
    (tmp_path / "resnet18_graphed.json").write_text(json.dumps(bench))
    assert "| resnet18 | graphed (ran eager) | 0.90 |" in mod.table(tmp_path)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PARTS": "eagr cell"}, "unknown part 'eagr'"),
        ({"OUT": "FILE"}, "is not a folder"),
    ],
)
def test_check_refuses_a_misspelt_part_or_a_file_as_out_before_running(tmp_path, env, message):
    import os
    import subprocess

    afile = tmp_path / "afile"
    afile.write_text("")
    env = {k: (str(afile) if v == "FILE" else v) for k, v in env.items()}
    env.setdefault("OUT", str(tmp_path / "out"))
    run = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and message in run.stderr
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
