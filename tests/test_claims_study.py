"""docs/claims.md's reviewed study recomputes from its committed records: the marks of
``examples/claims_sections.py`` (paired t-test, Holm within each section) and the numbers the
verdict table quotes, read from ``docs/results/claims_fmnist_study``."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest

from reports.stats.significance import holm
from tests.conftest import REPO

STUDY = REPO / "docs" / "results" / "claims_fmnist_study"


def _sections():
    spec = importlib.util.spec_from_file_location("claims_sections", REPO / "examples" /
                                                  "claims_sections.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_holm_within_a_section_is_the_step_down_of_its_own_p_values():
    """The adjustment the sections use, on values worked by hand: sorted p (0.01, 0.02, 0.04)
    over m = 3 → 0.03, 0.04, 0.04 (running max of (m − j + 1)·p)."""
    assert np.allclose(holm([0.04, 0.01, 0.02]), [0.04, 0.03, 0.04])


@pytest.mark.skipif(not STUDY.is_dir(), reason="the study's records are not in this checkout")
def test_the_deep_ensemble_section_recomputes_from_the_records():
    """S3 as docs/claims.md gives it: both σN-Ens configurations 0.73 pp below the deep ensemble
    (▼), worse in temperature-scaled NLL (▼), their raw-ECE edge marked and the scaled ECE not."""
    cs = _sections()
    (section,) = [s for s in cs.SECTIONS if s.title.startswith("S3.")]
    rows = cs.section_rows(str(STUDY), section)
    assert len(rows) == 10 and set(rows["n_pairs"]) == {6}
    marked = rows.set_index(["config", "metric"])
    sep = marked.loc[(cs.SEP, "acc")]
    assert round(100 * sep["mean_diff"], 2) == -0.73 and sep["p_holm"] <= 0.05
    assert marked.loc[(cs.SEP, "ts/nll"), "p_holm"] <= 0.05
    assert (
        marked.loc[(cs.SEP, "ece"), "mean_diff"] < 0
        and marked.loc[(cs.SEP, "ece"), "p_holm"] <= 0.05
    )
    assert marked.loc[(cs.SEP, "ts/ece"), "p_holm"] > 0.05
    # Holm within the section: the adjusted p-values are the section's own step-down
    assert np.allclose(rows["p_holm"], holm(rows["p_value"].to_numpy(float)))
    text = cs.markdown(section, rows)
    assert "| σN-Ens τ = 0.2 − deep ensemble | 6 | -0.73 [-0.96, -0.50] ▼ |" in text
    assert math.isclose(marked.loc[(cs.SHARE, "acc"), "mean_diff"], -0.0073, abs_tol=5e-5)


CORRUPTION = REPO / "docs" / "results" / "claims_fmnist_study_corruption"


@pytest.mark.skipif(not CORRUPTION.is_dir(), reason="the study's corruption records are absent")
def test_the_severity_table_recomputes_from_the_records():
    """S7's table: σN-Ens's ECE 16.82% at severity 1 and 38.77% at 5, the smallest slope of the
    three (5.65 pp per level), and temperature scaling fitted on clean images raising it."""
    cs = _sections()
    lines = cs.severities(str(CORRUPTION)).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| single", "| deep ensemble", "| σN-Ens τ = 0.2"
    ]  # fmt: skip
    sigma = lines[4].split(" | ")
    assert sigma[1] == "3" and sigma[3] == "16.82 ± 1.63" and sigma[7] == "38.77 ± 0.67"
    slopes = [float(line.split(" | ")[8].split(" ± ")[0]) for line in lines[2:]]
    assert slopes == [6.35, 6.21, 5.65]
    assert sigma[9] == "19.3 ± 1.4 → 42.2 ± 0.6" and sigma[10] == "5.92 ± 0.29"
