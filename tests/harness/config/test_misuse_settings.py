"""Settings that cannot mean what they say are refused by `harness validate` (exit 2, one line
naming the key): a conformal α every set would ignore, and YAML's unquoted on/off/yes/no, which
PyYAML reads as booleans, where a setting takes words."""

from __future__ import annotations

import textwrap

import pytest

from harness.cli import main
from harness.config.parse import load_suite
from tests.misuse import TINY_SUITE, no_traceback


def suite_with(tmp_path, old: str, new: str):
    text = textwrap.dedent(TINY_SUITE)
    assert old in text
    path = tmp_path / "s.yaml"
    path.write_text(text.replace(old, new))
    return path


def test_an_unquoted_off_is_read_as_the_word(tmp_path):
    path = suite_with(tmp_path, "lr: 0.05,", "lr: 0.05, cuda_graph: off,")
    assert load_suite(path).recipe.cuda_graph == "off"
    quoted = suite_with(tmp_path, "lr: 0.05,", "lr: 0.05, cuda_graph: 'off',")
    assert load_suite(quoted).recipe.cuda_graph == "off"


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("lr: 0.05,", "lr: 0.05, cuda_graph: on,",
         "recipe.cuda_graph: True is not one of ['auto', 'off']: YAML reads unquoted"),
        ("lr: 0.05,", "lr: 0.05, optimizer: no,", "quote the word you meant"),
        ("calibrate: true,", "calibrate: true, conformal_alpha: 0.001,",
         "evaluation.conformal_alpha: 0.001 leaves every conformal set the whole label set with "
         "200 calibration images (the smallest usable α is 1/(n + 1) = 0.00498)"),
        ("calibrate: true,", "calibrate: true, conformal_alpha: [0.1, 0.004],",
         "evaluation.conformal_alpha: 0.004 leaves every"),
    ],
)  # fmt: skip
def test_validate_refuses_a_setting_that_cannot_mean_what_it_says(
    tmp_path, capsys, old, new, needle
):
    path = suite_with(tmp_path, old, new)
    before = path.read_bytes()
    assert main(["validate", str(path)]) == 2
    out, err = no_traceback(capsys)
    assert needle in out + err
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_the_smallest_usable_alpha_validates(tmp_path, capsys):
    path = suite_with(tmp_path, "calibrate: true,", "calibrate: true, conformal_alpha: 0.005,")
    assert main(["validate", str(path)]) == 0  # 1/201 = 0.004975 < 0.005
    no_traceback(capsys)
