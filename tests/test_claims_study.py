"""docs/claims.md's reviewed study recomputes from its committed records: the marks of
``examples/claims_sections.py`` (paired t-test, Holm within each section) and the numbers the
verdict table quotes, read from ``docs/results/claims_fmnist_study``; and its families,
``suites/claims_fmnist/families.yaml``, precede the records of every section not marked
retrospective (checked against git and the records' ``started_at`` and ``finished_at``), and
none of those records was trained from a modified tree (``+dirty``) unless its folder's
``disclosed.json`` lists it."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

import harness.api as h
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


#: docs/claims.md §T as it states them: (section, configuration, reference, metric) → (the mean
#: difference as printed, in pp for accuracy and ECE, whether Holm marks it).
TUNED_CLAIMS = {
    ("T3", "sep", "deep_ensemble", "acc"): (-1.85, True),
    ("T3", "share", "deep_ensemble", "ece"): (-0.34, False),
    ("T4", "sep", "single", "acc"): (-1.02, True),
    ("T4", "deep_ensemble", "single", "ts/nll"): (-0.027, True),
    ("T6", "packed", "sep", "acc"): (-1.01, True),
    ("T6", "film", "sep", "ts/ece"): (0.12, False),
    ("T7", "share", "single", "acc"): (0.23, True),
    ("T7", "share", "single", "ts/nll"): (-0.008, True),
    ("T7", "sep", "single", "acc"): (-0.45, True),
    ("T7", "share", "deep_ensemble", "acc"): (-0.60, True),
    ("T7", "sep", "share", "ts/ece"): (-0.11, False),
    # M3 (claim 3, issue 59 item 4): σN-Ens at the τ selected at lr 0.2 and the deep ensemble
    # at M = 2, 4, 8
    ("M3", "sigma_m4", "sigma_m2", "acc"): (-0.01, False),
    ("M3", "sigma_m4", "sigma_m2", "nll"): (-0.002, False),
    ("M3", "sigma_m8", "sigma_m4", "acc"): (0.05, False),
    ("M3", "sigma_m8", "sigma_m4", "nll"): (0.002, False),
    ("M3", "de_m4", "de_m2", "acc"): (0.27, False),
    ("M3", "de_m4", "de_m2", "nll"): (-0.009, True),
    ("M3", "de_m4", "de_m2", "ece"): (0.47, True),
    ("M3", "de_m8", "de_m4", "acc"): (0.18, False),
    ("M3", "de_m8", "de_m4", "ts/nll"): (-0.006, True),
    ("M3", "sigma_m2", "de_m2", "acc"): (-0.35, False),
    ("M3", "sigma_m2", "de_m2", "nll"): (0.013, True),
    ("M3", "sigma_m4", "de_m4", "acc"): (-0.62, False),
    ("M3", "sigma_m4", "de_m4", "ece"): (-0.38, True),
    ("M3", "sigma_m8", "de_m8", "acc"): (-0.75, True),
    ("M3", "sigma_m8", "de_m8", "ts/nll"): (0.028, True),
}


@functools.cache
def _section_table(section_id: str):
    """One section's rows, computed once for all of its parametrized claims."""
    cs = _sections()
    (section,) = [s for s in cs.SECTIONS if s.id == section_id]
    if not (REPO / section.results).is_dir():
        pytest.skip(f"{section.results} is not in this checkout")
    return section, cs.section_rows(section.results, section)


@pytest.mark.parametrize("key", sorted(TUNED_CLAIMS), ids="-".join)
def test_the_tuned_sections_recompute_from_the_records(key):
    """§T's and M3's marks and numbers (issue 49 item 5, T7, issue 59 item 4), from their
    records and registered families: a changed record or family changes the sentence, and this
    test says which."""
    section_id, config, reference, metric = key
    section, table = _section_table(section_id)
    rows = table.set_index(["config", "reference", "metric"])
    configs = _sections()._CONFIGS
    row = rows.loc[(configs[config]["select"], configs[reference]["select"], metric)]
    value, marked = TUNED_CLAIMS[key]
    scale, digits = (100, 2) if metric in ("acc", "ece", "ts/ece") else (1, 3)
    assert round(scale * row["mean_diff"], digits) == value
    assert bool(row["p_holm"] <= section.alpha) is marked
    assert np.allclose(rows["p_holm"], holm(rows["p_value"].to_numpy(float)))


M_TUNED = REPO / "docs" / "results" / "claims_fmnist_m_tuned"


@pytest.mark.skipif(not M_TUNED.is_dir(), reason="section M3's records are absent")
def test_m3_describes_each_ensemble_size_with_its_parameters_and_sharing():
    """docs/claims.md M3's row table: a row per M, the members of σN-Ens at the selected τ
    sharing every feature (k_eff ≈ M) while its parameters barely grow."""
    text = _sections().describe(str(M_TUNED))
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()[2:]}
    sigma = "sigma_ens (gamma_init_mean=0.0, gate_fold=constant, lam=0.003), M = {}"
    want = {2: ("1.998", "14778"), 4: ("3.987", "15258"), 8: ("7.908", "16218")}
    for m, (k_eff, params) in want.items():
        row = rows[sigma.format(m)]
        assert row[1] == "6" and row[11].startswith(k_eff) and row[14].startswith(params)
    assert rows["deep_ensemble, M = 8"][14].startswith("115664")
    assert rows["single, M = 1"][2].startswith("88.01")


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


# --- pre-registration: suites/claims_fmnist/families.yaml -------------------------------------

FAMILIES = REPO / "suites" / "claims_fmnist" / "families.yaml"


def _git(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _history_or_skip() -> None:
    """Skip (with the reason) where the check has no history to read: no git, no repository, or
    a shallow clone (its oldest commit would show every file as added then, later than it was)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the families file's commit cannot be read")
    inside = _git("rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or _git("rev-parse", "--verify", "HEAD").returncode != 0:
        pytest.skip("no git history in this checkout: the families file's commit cannot be read")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the families file's first commit is not in its history")


#: A results folder's list of its records trained from a modified tree, and why.
DISCLOSED = "disclosed.json"


def disclosed(folder: Path) -> set[tuple[str, str, str]]:
    """The records ``folder``'s :data:`DISCLOSED` lists, as ``(cell_id, started_at,
    git_commit)``: one run of one cell, not every run of it. Empty without the file; a file not
    laid out so fails the test (a disclosure nobody can read discloses nothing)."""
    path = folder / DISCLOSED
    if not path.is_file():
        return set()
    data = json.loads(path.read_text(encoding="utf-8"))
    found = set()
    for group in data["dirty"]:
        assert group["git_commit"].endswith("+dirty"), f"{path}: {group['git_commit']} is clean"
        assert group["reason"].strip(), f"{path}: a group without its reason"
        found |= {(c["cell_id"], c["started_at"], group["git_commit"]) for c in group["cells"]}
    return found


def registration_problems(
    records: Iterable[dict],
    registered: datetime,
    reused: Iterable[dict] = (),
    listed: Iterable[tuple[str, str, str]] = (),
) -> list[str]:
    """What keeps a registered section's records from standing on its registration, one line
    each: a record that finished before it (``early_records``) or started before it (a cell
    under way when the section was committed was not chosen by it; no ``started_at``: nothing
    dates it), neither for a verbatim copy of a ``reused`` record (same id, ``started_at`` and
    ``finished_at``); and a record trained from a modified tree (``environment.git_commit`` ends
    in ``+dirty``) that ``listed`` (its folders' :func:`disclosed`) does not name."""
    records, reused, listed = list(records), list(reused), set(listed)
    problems = [f"{e} finished before {registered.isoformat()}"
                for e in _sections().early_records(records, registered, reused)]  # fmt: skip
    copies = {(r.get("cell_id"), r.get("started_at"), r.get("finished_at")) for r in reused}
    for record in records:
        cell, started = record.get("cell_id"), record.get("started_at")
        copy = (cell, started, record.get("finished_at")) in copies
        if not copy and (not started or datetime.fromisoformat(started) < registered):
            problems.append(f"{cell} {started} started before {registered.isoformat()}")
        commit = str((record.get("environment") or {}).get("git_commit", ""))
        if commit.endswith("+dirty") and (cell, started, commit) not in listed:
            problems.append(f"{cell} {started} trained from a modified tree ({commit}), not in "
                            f"its folder's {DISCLOSED}")  # fmt: skip
    return sorted(problems)


def test_the_families_file_holds_the_study_sections_the_tables_print():
    """The sections the script printed from its own code before the file, now read from it: the
    same titles, comparisons and metrics in the same order, S2–S9 all marked retrospective."""
    cs = _sections()
    study = cs.sections_for("docs/results/claims_fmnist_study")
    assert [s.id for s in study] == ["S2", "S3", "S4", "S6", "S8", "S9"]
    assert [s.id for s in cs.sections_for("claims_fmnist_study_corruption")] == ["S7"]
    assert all(
        s.retrospective for s in (*study, *cs.sections_for("x/claims_fmnist_study_corruption"))
    )
    (s3,) = [s for s in study if s.id == "S3"]
    assert s3.pairs == ((cs.SEP, "deep_ensemble"), (cs.SHARE, "deep_ensemble"))
    assert s3.metrics == ("acc", "nll", "ece", "ts/nll", "ts/ece") and s3.test == "t"
    fresh = [s for s in cs.SECTIONS if not s.retrospective]
    assert {s.id for s in fresh} >= {f"E{n}.S{k}" for n in (12, 24, 40) for k in (2, 3, 4)}
    assert {"T3", "T4", "T6"} <= {s.id for s in fresh}
    (c9,) = [s for s in fresh if s.id == "C9"]  # issue 49 item 6: selected on validation first
    assert c9.selection == "docs/results/claims_fmnist_conversion_select"


def test_a_section_whose_folder_does_not_exist_yet_is_pending(tmp_path):
    """C9's final folder is written only after its selection has run: until then its table is
    pending (said, not an error that ends the listing)."""
    cs = _sections()
    (c9,) = cs.sections_for("docs/results/claims_fmnist_conversion")
    with pytest.raises(cs.NotRun, match="does not exist"):
        cs.section_rows(str(tmp_path / "claims_fmnist_conversion"), c9)


def test_a_section_whose_reference_has_no_records_yet_is_pending(tmp_path):
    """A folder whose grid is still running (T3's deep ensemble trained after σN-Ens's rows were
    copied in): the section is pending, not an error that ends the listing."""
    cs = _sections()
    (t3,) = [s for s in cs.sections_for("docs/results/claims_fmnist_tuned") if s.id == "T3"]
    study = REPO / "docs/results/claims_fmnist_study"
    if not study.is_dir():
        pytest.skip("the study's records are not in this checkout")
    for cell in study.iterdir():  # σN-Ens's rows alone: no deep ensemble yet
        if cell.is_dir() and '"sigma_ens"' in (cell / "cell.json").read_text():
            shutil.copytree(cell, tmp_path / cell.name)
    with pytest.raises(cs.NotRun, match="no done deep_ensemble records yet"):
        cs.section_rows(str(tmp_path), t3)


def test_early_records_are_those_finished_before_the_registration_but_verbatim_copies():
    """On fabricated records: one finished before the section's commit is flagged, one after is
    not, a verbatim copy of a reused folder's record (same id and finished_at) is not, a copy
    with another finished_at is, and a record without finished_at is (nothing dates it)."""
    cs = _sections()
    registered = datetime.fromisoformat("2026-12-04T12:00:00+00:00")
    old = {"cell_id": "a", "finished_at": "2026-12-03T20:00:00+00:00"}
    records = [
        old,
        {"cell_id": "b", "finished_at": "2026-12-04T12:00:01+00:00"},
        {"cell_id": "c", "finished_at": "2026-12-04T11:59:59+00:00"},
        {"cell_id": "d", "finished_at": None},
    ]
    assert cs.early_records(records, registered) == [
        "a 2026-12-03T20:00:00+00:00", "c 2026-12-04T11:59:59+00:00", "d None"
    ]  # fmt: skip
    assert cs.early_records(records, registered, reused=[old]) == [
        "c 2026-12-04T11:59:59+00:00", "d None"
    ]  # fmt: skip
    moved = {"cell_id": "c", "finished_at": "2026-12-02T00:00:00+00:00"}
    assert "c 2026-12-04T11:59:59+00:00" in cs.early_records(records, registered, reused=[moved])


def test_a_record_that_started_before_the_registration_is_refused_though_it_finished_after():
    """On fabricated records (issue 59 item 3): a cell under way when its section was committed
    (started 1 s before, finished after) passes the ``finished_at`` check alone and is refused
    now; one started after passes; one without ``started_at`` is refused (nothing dates it); a
    verbatim copy of a reused record is not, a copy whose ``started_at`` moved is."""
    registered = datetime.fromisoformat("2026-12-04T12:00:00+00:00")
    clean = {"git_commit": "83192f3"}
    under_way = {"cell_id": "a", "started_at": "2026-12-04T11:59:59+00:00",
                 "finished_at": "2026-12-04T12:05:00+00:00", "environment": clean}  # fmt: skip
    after = {"cell_id": "b", "started_at": "2026-12-04T12:00:01+00:00",
             "finished_at": "2026-12-04T12:05:00+00:00", "environment": clean}  # fmt: skip
    undated = {**after, "cell_id": "c", "started_at": None}
    assert _sections().early_records([under_way, after], registered) == []  # the old check
    assert registration_problems([under_way, after, undated], registered) == [
        "a 2026-12-04T11:59:59+00:00 started before 2026-12-04T12:00:00+00:00",
        "c None started before 2026-12-04T12:00:00+00:00",
    ]
    assert registration_problems([under_way], registered, reused=[under_way]) == []
    moved = {**under_way, "started_at": "2026-12-04T11:00:00+00:00"}
    assert registration_problems([under_way], registered, reused=[moved]) == [
        "a 2026-12-04T11:59:59+00:00 started before 2026-12-04T12:00:00+00:00"
    ]


def test_a_record_from_a_modified_tree_stands_only_where_its_folder_discloses_it(tmp_path):
    """On fabricated records and a fabricated ``disclosed.json`` (issue 59 item 3): a ``+dirty``
    record is refused unless the folder lists that run (cell id, ``started_at`` and commit):
    another run of the same cell, or the same run at another commit, is not excused, and a
    verbatim copy of a reused record is not either (its disclosure travels with its folder)."""
    registered = datetime.fromisoformat("2026-12-04T12:00:00+00:00")
    dirty = "83192f3dbe28ff3aae9b69c46444e00f385ffb8b+dirty"
    record = {"cell_id": "d", "started_at": "2026-12-04T13:00:00+00:00",
              "finished_at": "2026-12-04T13:05:00+00:00",
              "environment": {"git_commit": dirty}}  # fmt: skip
    refused = [f"d 2026-12-04T13:00:00+00:00 trained from a modified tree ({dirty}), not in its "
               f"folder's {DISCLOSED}"]  # fmt: skip
    assert disclosed(tmp_path) == set()  # no file: nothing disclosed
    assert registration_problems([record], registered) == refused
    assert registration_problems([record], registered, reused=[record]) == refused

    def disclose(started_at: str, commit: str) -> set[tuple[str, str, str]]:
        cells = [{"cell_id": "d", "started_at": started_at}]
        group = {"git_commit": commit, "reason": "the tree held X", "cells": cells}
        (tmp_path / DISCLOSED).write_text(json.dumps({"dirty": [group]}), encoding="utf-8")
        return disclosed(tmp_path)

    listed = disclose("2026-12-04T13:00:00+00:00", dirty)
    assert listed == {("d", "2026-12-04T13:00:00+00:00", dirty)}
    assert registration_problems([record], registered, listed=listed) == []
    other_run = disclose("2026-12-04T14:00:00+00:00", dirty)
    assert registration_problems([record], registered, listed=other_run) == refused
    other_commit = disclose("2026-12-04T13:00:00+00:00", "0a2a0c2+dirty")
    assert registration_problems([record], registered, listed=other_commit) == refused
    (tmp_path / DISCLOSED).write_text(json.dumps({"dirty": [{"git_commit": dirty, "reason": " ",
                                      "cells": []}]}), encoding="utf-8")  # fmt: skip
    with pytest.raises(AssertionError, match="a group without its reason"):
        disclosed(tmp_path)


def test_a_section_is_registered_from_the_commit_since_which_it_is_unchanged(tmp_path):
    """In a scratch repository: a section committed, then another added, then the first changed —
    each is registered at the commit of its present form, and an uncommitted change unregisters
    it. Retitling is not a change of substance."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    cs = _sections()
    head = FAMILIES.read_text(encoding="utf-8").split("\nsections:\n")[0] + "\nsections:\n"

    def section(sid: str, pairs: str, title: str = "t") -> str:
        return (f"  - id: {sid}\n    title: {title}\n    results: docs/results/x\n    comparisons:"
                f" {pairs}\n    metrics: calibration\n    test: t_holm\n")  # fmt: skip

    path = tmp_path / "families.yaml"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip

    def commit(text: str, when: str) -> None:
        path.write_text(text, encoding="utf-8")
        dates = {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
        for args in (["add", "families.yaml"], ["commit", "-q", "-m", when]):
            subprocess.run(["git", *args], cwd=tmp_path, check=True, env={**os.environ, **env,
                           **dates})  # fmt: skip

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    a1, a2 = section("A", "[[sep, single]]"), section("A", "[[sep, deep_ensemble]]")
    b = section("B", "[[share, single]]")
    commit(head + a1, "2026-12-01T00:00:00+00:00")
    commit(head + a1 + b, "2026-12-02T00:00:00+00:00")
    commit(head + section("A", "[[sep, single]]", "retitled") + b, "2026-12-03T00:00:00+00:00")
    times = cs.registration_times(path, repo=tmp_path)
    assert times == {"A": datetime.fromisoformat("2026-12-01T00:00:00+00:00"),
                     "B": datetime.fromisoformat("2026-12-02T00:00:00+00:00")}  # fmt: skip
    commit(head + a2 + b, "2026-12-04T00:00:00+00:00")
    assert cs.registration_times(path, repo=tmp_path)["A"] == datetime.fromisoformat(
        "2026-12-04T00:00:00+00:00"
    )
    path.write_text(head + a1 + b, encoding="utf-8")  # back to A's old form, not committed
    assert cs.registration_times(path, repo=tmp_path) == {
        "A": None, "B": datetime.fromisoformat("2026-12-02T00:00:00+00:00")
    }  # fmt: skip


def test_the_records_of_a_preregistered_section_came_after_it_from_a_known_tree():
    """Issue 49 item 3 and issue 59 item 3, on the committed records: every section of the
    families file not marked ``retrospective: true`` is registered by a commit (its present form
    committed), never before the file's first commit (``git log --diff-filter=A``), and no record
    it stands on — the configurations it compares in its results folder, every record of its
    selection folder — started or finished before that commit, except verbatim copies from the
    folder it names under ``reuse``; nor was one trained from a modified tree (``+dirty``) unless
    one of those folders' ``disclosed.json`` lists it. Sections whose cells have not run yet
    pass as they are, and are checked once their records are committed."""
    _history_or_skip()
    cs = _sections()
    rel = FAMILIES.relative_to(REPO).as_posix()
    added = _git("log", "--diff-filter=A", "--format=%cI", "--", rel).stdout.split()
    assert added, f"{rel} is not committed: a family is registered by its commit"
    first = datetime.fromisoformat(added[-1])
    times = cs.registration_times()
    problems = []
    for section in cs.SECTIONS:
        if section.retrospective:
            continue
        registered = times[section.id]
        if registered is None:
            problems.append(f"{section.id}: its present form is not committed")
            continue
        assert registered >= first
        reused = h.load_records(REPO / section.reuse) if section.reuse else []
        # a copied record keeps its disclosure: the folder it was copied from is read too
        folders = {f for f in (section.results, section.selection, section.reuse) if f}
        listed = set().union(*(disclosed(REPO / f) for f in folders))
        found = registration_problems(cs.section_records(section), registered, reused, listed)
        problems += [f"{section.id}: {p}" for p in found]
    assert not problems, "\n".join(problems)


def test_every_disclosure_names_a_committed_modified_tree_record():
    """Each ``docs/results/*/disclosed.json`` lists records its folder holds, each of them
    ``+dirty`` at the commit it gives: a disclosure of a record that is not there (renamed,
    retrained, or never trained so) would excuse nothing and hide the slip."""
    files = sorted((REPO / "docs" / "results").glob(f"*/{DISCLOSED}"))
    stale = []
    for path in files:
        held = {(r.get("cell_id"), r.get("started_at"),
                 (r.get("environment") or {}).get("git_commit"))
                for r in h.load_records(path.parent)}  # fmt: skip
        stale += [f"{path.parent.name}: {c} {s} {g}" for c, s, g in
                  sorted(disclosed(path.parent) - held)]  # fmt: skip
    assert not stale, "disclosed, not found:\n" + "\n".join(stale)


@pytest.mark.skipif(not STUDY.is_dir(), reason="the study's records are not in this checkout")
def test_retrospective_sections_are_those_whose_records_came_first():
    """``retrospective: true`` is a statement about the records, checked: each such section has
    records, and some of them finished before the families file was first committed (else the
    family could have been registered, and should be)."""
    _history_or_skip()
    cs = _sections()
    rel = FAMILIES.relative_to(REPO).as_posix()
    added = _git("log", "--diff-filter=A", "--format=%cI", "--", rel).stdout.split()
    first = datetime.fromisoformat(added[-1]) if added else datetime.now(timezone.utc)
    for section in cs.SECTIONS:
        if section.retrospective:
            records = cs.section_records(section)
            assert records, f"{section.id}: retrospective, but no records"
            if section.id == "S2":  # σN-Ens at τ = 0.2 and τ = 2, six seeds each
                assert len(records) == 12
            assert cs.early_records(records, first), f"{section.id}: no record precedes the file"


SELECT = REPO / "docs" / "results" / "claims_fmnist_conversion_select"
# its 2-epoch, lr 0.01 conversions at seeds 0 and 1: τ 0.05/λ 0.003, τ 0.05/λ 0.03, τ 0.2/λ 0.003
TWO_EPOCH = ("fed8efa3eccbef2a", "f11e60110a08bfb8", "fe8fa55e17e4a9b8", "e895f7f4ca8cff20",
             "f28429964f17e65f", "aad91951f0269f2f")  # fmt: skip


@pytest.mark.skipif(not SELECT.is_dir(), reason="the conversion selection's records are absent")
def test_the_selection_table_applies_the_registered_rule(tmp_path):
    """C9's rule on six committed records (three settings × two seeds): without the k_eff
    bound the lowest mean validation NLL wins (τ 0.2, λ 0.003: 0.3578, members one model at
    k_eff 3.99); with k_eff ≤ 3.5 only τ 0.05, λ 0.03 separates (1.55, 1.56), so it is selected
    although its validation NLL (0.7300) is the worst. A setting short of a seed is never
    eligible."""
    cs = _sections()
    folder = tmp_path / "claims_fmnist_conversion_select"
    for cell in TWO_EPOCH:
        shutil.copytree(SELECT / cell, folder / cell, ignore=shutil.ignore_patterns("*.npz"))

    def selected(text: str) -> list[str]:
        return [line for line in text.splitlines() if "**selected**" in line]

    (line,) = selected(cs.selection(str(folder)))
    assert "lam=0.003, pretrain_epochs=12, tau=0.2 |" in line
    assert "| 2 | 0.3578 | 3.99, 3.99 |" in line
    (line,) = selected(cs.selection(str(folder), k_eff_max=3.5))
    assert "lam=0.03, pretrain_epochs=12, tau=0.05 |" in line
    assert "| 0.7300 | 1.55, 1.56 |" in line
    shutil.rmtree(folder / "e895f7f4ca8cff20")  # τ 0.05, λ 0.03 at seed 1 only
    assert selected(cs.selection(str(folder), k_eff_max=3.5)) == []
    (line,) = selected(cs.selection(str(folder)))
    assert "tau=0.2 |" in line
