"""The generated leaderboard in a real browser: headless Chromium driven by selenium.

Uses Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``; override with HARNESS_CHROMIUM / HARNESS_CHROMEDRIVER) and never
downloads a browser or driver.
Skips with a one-line reason when either (or selenium) is missing, unless HARNESS_REQUIRE_BROWSER=1
(set by CI), in which case it fails. The screenshot goes to ``artifacts/leaderboard.png``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from record_factory import make_record, write_records

from reports.columns import leaderboard_columns
from reports.records.index import load_results
from reports.render.leaderboard import write_report
from reports.render.page import ReportOptions
from reports.stats.bolding import bold_rows, config_key

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "artifacts"
CHROMIUM = os.environ.get("HARNESS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = (
    os.environ.get("HARNESS_CHROMEDRIVER")
    or shutil.which("chromedriver")
    or "/usr/bin/chromedriver"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)


def _unavailable() -> str | None:
    if not Path(CHROMIUM).is_file():
        return f"chromium not found at {CHROMIUM} (apt-get install chromium chromium-driver)"
    if not Path(CHROMEDRIVER).is_file():
        return f"chromedriver not found at {CHROMEDRIVER} (apt-get install chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return None


def _require_browser() -> None:
    """Skip with a one-line reason when no browser is usable; fail instead when CI requires one."""
    reason = _unavailable()
    if reason:
        if os.environ.get("HARNESS_REQUIRE_BROWSER") == "1":
            pytest.fail(f"HARNESS_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)


def test_missing_browser_skips_or_fails_when_required(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("HARNESS_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium not found at /nonexistent/chromium"):
        _require_browser()
    monkeypatch.setenv("HARNESS_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="HARNESS_REQUIRE_BROWSER=1 but chromium not"):
        _require_browser()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """A report over 2 datasets × 2 backbones × methods × M, 6 seeds each; its file:// URL.

    Six seeds: the fewest with which the sign-flip test can mark a difference. σN-Ens at τ=0.1
    measured its throughput on a shared device. mCE relative to the deep ensemble.
    """
    results = tmp_path_factory.mktemp("results")
    recs = []
    shared = {"cost": {"device": "cpu", "precision": "fp32", "shared_device": True}}
    for d, dataset in enumerate(("cifar10", "digits")):
        for b, backbone in enumerate(("resnet18", "wrn28")):
            for seed in range(6):
                common = {
                    "dataset": dataset,
                    "backbone": backbone,
                    "seed": seed,
                    "ood_sets": ("svhn", "textures"),
                }
                for M in (1, 4):
                    recs.append(
                        make_record(
                            method="deep_ensemble",
                            M=M,
                            params=2_000_000 * M,
                            acc=0.70 + 0.03 * M + 0.01 * b - 0.05 * d + 0.004 * seed,
                            nll=1.2 - 0.08 * M - 0.02 * b + 0.01 * seed,
                            **common,
                        )
                    )
                for tau in (0.1, 1.0):
                    recs.append(
                        make_record(
                            method="sigma_ens",
                            M=4,
                            hparams={"tau": tau},
                            params=2_100_000,
                            k_eff=1 + tau,
                            eval_ips=2500,
                            acc=0.80 + 0.02 * tau - 0.05 * d + 0.004 * seed,
                            nll=0.85 - 0.05 * tau + 0.01 * seed,
                            ece=0.04 - 0.01 * tau,
                            overrides=shared if tau == 0.1 else None,
                            **common,
                        )
                    )
    recs.append(make_record(method="packed_ensemble", M=4, status="failed"))
    write_records(results, recs)
    options = ReportOptions(mce_baseline="deep_ensemble")
    html = write_report(
        results, tmp_path_factory.mktemp("report"), expected=["not-run-yet"], options=options
    )
    return html.as_uri()


ROWS_JS = """
return Array.from(document.querySelectorAll('#leaderboard tbody tr.lb-row'))
  .filter(r => !r.hidden)
  .map(r => ({dataset: r.dataset.dataset, backbone: r.dataset.backbone, m: r.dataset.m,
              acc: r.querySelector('td[data-col="acc"]').dataset.value,
              nll: r.querySelector('td[data-col="nll"]').dataset.value,
              method: r.querySelector('td[data-col="method"]').dataset.value,
              best: Array.from(r.querySelectorAll('td.best')).map(td => td.dataset.col)}));
"""


def visible_rows(drv) -> list[dict]:
    return drv.execute_script(ROWS_JS)


def console_problems(drv) -> list[str]:
    """Console errors/warnings, and any request that left the page (network must stay unused)."""
    bad = [
        f"console {e['level']}: {e['message']}"
        for e in drv.get_log("browser")
        if e["level"] in ("SEVERE", "WARNING")
    ]
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            url = msg["params"]["request"]["url"]
            if url.startswith(("http:", "https:", "ws:", "wss:", "ftp:")):  # not chrome://
                bad.append(f"network request: {url}")
    return bad


def header(drv, col: str):
    from selenium.webdriver.common.by import By

    return drv.find_element(By.CSS_SELECTOR, f'#leaderboard th.sortable[data-col="{col}"]')


def test_click_header_sorts_rows(driver, page):
    driver.get(page)
    before = visible_rows(driver)
    assert len(before) == 16  # 2 datasets × 2 backbones × (2 M + 2 τ)
    header(driver, "acc").click()  # accuracy: higher is better → best first (descending)
    accs = [float(r["acc"]) for r in visible_rows(driver)]
    assert accs == sorted(accs, reverse=True)
    assert accs != [float(r["acc"]) for r in before]  # the order really changed
    assert header(driver, "acc").get_attribute("aria-sort") == "descending"
    header(driver, "acc").click()  # toggles
    accs = [float(r["acc"]) for r in visible_rows(driver)]
    assert accs == sorted(accs)
    assert header(driver, "acc").get_attribute("aria-sort") == "ascending"
    header(driver, "nll").click()  # NLL: lower is better → ascending first
    nlls = [float(r["nll"]) for r in visible_rows(driver)]
    assert nlls == sorted(nlls)
    assert header(driver, "acc").get_attribute("aria-sort") == "none"
    header(driver, "method").click()
    methods = [r["method"] for r in visible_rows(driver)]
    assert methods == sorted(methods)
    assert console_problems(driver) == []


def test_filters_select_rows_and_keep_the_bolding(driver, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(page)
    shown = visible_rows(driver)
    Select(driver.find_element(By.ID, "filter-dataset")).select_by_value("digits")
    rows = visible_rows(driver)
    assert len(rows) == 8 and {r["dataset"] for r in rows} == {"digits"}
    Select(driver.find_element(By.ID, "filter-backbone")).select_by_value("wrn28")
    Select(driver.find_element(By.ID, "filter-M")).select_by_value("4")
    rows = visible_rows(driver)
    assert [(r["dataset"], r["backbone"], r["m"]) for r in rows] == [("digits", "wrn28", "4")] * 3
    assert driver.find_element(By.ID, "row-count").text == "3 of 16 rows"
    # Bold follows a statistical rule over all rows of the dataset: filters do not change it.
    assert [r["best"] for r in rows] == [r["best"] for r in shown if r in rows]
    header(driver, "acc").click()  # sorting keeps the filter
    accs = [float(r["acc"]) for r in visible_rows(driver)]
    assert len(accs) == 3 and accs == sorted(accs, reverse=True)
    Select(driver.find_element(By.ID, "filter-M")).select_by_value("1")
    assert [r["method"] for r in visible_rows(driver)] == ["deep_ensemble"]
    driver.find_element(By.ID, "filter-reset").click()
    assert len(visible_rows(driver)) == 16
    assert console_problems(driver) == []


PAIRED_JS = """
return Array.from(document.querySelectorAll('#paired-table tbody tr.paired-row'))
  .filter(r => !r.hidden)
  .map(r => ({dataset: r.dataset.dataset, backbone: r.dataset.backbone, m: r.dataset.m,
              method: r.dataset.method, reference: r.dataset.reference,
              hparams: r.cells[4].textContent,
              cells: Object.fromEntries(Array.from(r.querySelectorAll('td.delta')).map(td => [
                td.dataset.col,
                {value: parseFloat(td.dataset.value), lo: parseFloat(td.dataset.lo),
                 hi: parseFloat(td.dataset.hi), classes: Array.from(td.classList),
                 text: td.textContent,
                 mark: td.querySelector('.sig-mark')
                   ? getComputedStyle(td.querySelector('.sig-mark')).color : null}]))}));
"""
GREEN, RED = "rgb(11, 122, 44)", "rgb(179, 38, 30)"


def test_paired_section_renders(driver, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(page)
    assert driver.find_element(By.TAG_NAME, "h1").text == "Leaderboard — toy"
    section = driver.find_element(By.ID, "paired")
    assert section.is_displayed()
    title = section.find_element(By.TAG_NAME, "h2").text
    assert title == "Δ vs deep_ensemble, mean over paired seeds, 95% t-interval"
    assert "exact sign-flip permutation test" in section.text
    rows = driver.execute_script(PAIRED_JS)
    assert len(rows) == 8  # 2 datasets × 2 backbones × 2 τ; deep_ensemble is the reference
    assert {r["method"] for r in rows} == {"sigma_ens"}
    assert {r["reference"] for r in rows} == {"deep_ensemble M=4"}  # same M, never M=1
    for r in rows:
        b = 0 if r["backbone"] == "resnet18" else 1
        acc, nll = r["cells"]["acc"], r["cells"]["nll"]
        if r["hparams"] == "tau=0.1":  # Δacc = −0.018 − 0.01 b on every seed: worse, in red
            assert acc["value"] == pytest.approx(-0.018 - 0.01 * b)
            assert {"sig", "worse"} <= set(acc["classes"]) and acc["mark"] == RED
            assert "▼" in acc["text"] and acc["lo"] <= acc["value"] <= acc["hi"] < 0
            # ΔNLL = −0.035 + 0.02 b: lower is better, in green
            assert nll["value"] == pytest.approx(-0.035 + 0.02 * b)
            assert {"sig", "better"} <= set(nll["classes"]) and nll["mark"] == GREEN
        elif b == 0:  # τ = 1 on resnet18: the same accuracy as the deep ensemble
            assert acc["value"] == 0 and "sig" not in acc["classes"] and acc["mark"] is None
    marks = driver.find_elements(By.CSS_SELECTOR, "#leaderboard td.sig .sig-mark")
    assert marks and all(m.is_displayed() for m in marks)
    assert {m.text for m in marks} == {"▲", "▼"}
    Select(driver.find_element(By.ID, "filter-dataset")).select_by_value("digits")
    rows = driver.execute_script(PAIRED_JS)
    assert len(rows) == 4 and {r["dataset"] for r in rows} == {"digits"}  # filters apply here too
    driver.find_element(By.ID, "filter-reset").click()
    assert len(driver.execute_script(PAIRED_JS)) == 8
    assert console_problems(driver) == []


def test_page_renders_and_screenshot(driver, page):
    from selenium.webdriver.common.by import By

    driver.get(page)
    figures = driver.find_elements(By.CSS_SELECTOR, "#figures figure img")
    assert len(figures) == 7  # the 6 of before and the training curves (records keep history)
    assert all(
        driver.execute_script("return arguments[0].naturalWidth", img) > 100 for img in figures
    )  # every data-URI image decoded
    problems = driver.find_elements(By.CSS_SELECTOR, "#problems tr.problem")
    assert {p.get_attribute("data-status") for p in problems} == {"failed", "missing"}
    assert "ID as the positive class" in driver.find_element(By.ID, "conventions").text
    assert "torch" in driver.find_element(By.ID, "provenance").text
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {
        "x": 0,
        "y": 0,
        "width": size["width"],
        "height": min(size["height"], 16000),
        "scale": 1,
    }
    png = driver.execute_cdp_cmd(  # the whole page, not just the viewport
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )["data"]
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "leaderboard.png"
    shot.write_bytes(base64.b64decode(png))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert console_problems(driver) == []


CELLS_JS = """
const out = {};
for (const r of document.querySelectorAll('#leaderboard tbody tr.lb-row')) {
  const key = ['dataset', 'backbone', 'method', 'M', 'hparams']
    .map(k => r.querySelector('td[data-col="' + k + '"]').dataset.value).join(' | ');
  out[key] = Object.fromEntries(Array.from(r.querySelectorAll('td[data-col]')).map(td => [
    td.dataset.col, {text: td.querySelector('span.v') ? td.querySelector('span.v').textContent
                                                     : td.textContent,
                     shown: td.offsetParent !== null, classes: Array.from(td.classList),
                     ci: td.dataset.ci, std: td.dataset.std, title: td.title,
                     color: getComputedStyle(td).color}]));
}
return out;
"""


def _config(key: tuple) -> str:
    return " | ".join(key[:5])


def test_new_columns_picker_interval_bolding_and_missing_cells(driver, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(page)
    cells = driver.execute_script(CELLS_JS)
    sigma = cells["digits | wrn28 | sigma_ens | 4 | tau=0.1"]
    for col in ("aurc", "mCE", "train_device_h", "ood_far/msp/auroc", "ood/svhn/msp/fpr95"):
        assert sigma[col]["shown"], col
    for col in ("ood/svhn/entropy/auroc", "ood/textures/mi/aupr_out", "aece", "k_eff_scale"):
        assert not sigma[col]["shown"], col  # in the column picker, hidden by default
    for col in ("disagreement", "k_eff"):  # the diversity that decides the comparison: shown
        assert sigma[col]["shown"], col
    # mCE vs the deep ensemble (M=1 and M=4 averaged, 6 seeds): error per corruption 1 − (0.745 −
    # 0.24) = 0.495; σN-Ens τ=0.1 seed s: 0.488 − 0.004 s → mean 0.478 / 0.495, std 0.0075 / 0.495
    assert sigma["mCE"]["text"] == "96.57 ± 1.51"
    # throughput measured on a shared device: greyed, with the reason
    assert (
        "shared" in sigma["eval_ips"]["classes"]
        and "shared the device (6 of 6 seeds)" in sigma["eval_ips"]["title"]
    )
    assert sigma["eval_ips"]["color"] == "rgb(154, 160, 171)"
    tau1 = next(k for k in cells if k.startswith("digits | wrn28 | sigma_ens | 4 | tau=1"))
    assert "shared" not in cells[tau1]["eval_ips"]["classes"]

    # the column picker shows a hidden column and recounts the group header
    ood_head = driver.find_element(By.CSS_SELECTOR, "#leaderboard tr.groups th.g-OOD")
    span = int(ood_head.get_attribute("colspan"))
    driver.find_element(By.CSS_SELECTOR, "#column-picker summary").click()
    box = driver.find_element(
        By.CSS_SELECTOR, 'input.col-toggle[data-col="ood/svhn/entropy/auroc"]'
    )
    assert not box.is_selected()
    box.click()
    assert header(driver, "ood/svhn/entropy/auroc").is_displayed()
    assert int(ood_head.get_attribute("colspan")) == span + 1
    driver.find_element(By.CSS_SELECTOR, 'input.col-toggle[data-col="aurc"]').click()
    assert not header(driver, "aurc").is_displayed()
    cells = driver.execute_script(CELLS_JS)
    assert cells["digits | wrn28 | sigma_ens | 4 | tau=0.1"]["ood/svhn/entropy/auroc"]["shown"]

    # the interval view: std → 95% CI of the mean, in every metric cell
    Select(driver.find_element(By.ID, "interval-view")).select_by_value("ci")
    cells = driver.execute_script(CELLS_JS)
    assert all(c["text"] == c["ci"] for row in cells.values() for c in row.values() if c["ci"])
    acc = cells["digits | wrn28 | sigma_ens | 4 | tau=0.1"]["acc"]
    assert acc["ci"] != acc["std"] and "±" in acc["ci"]

    # bold: the best and every configuration not significantly different from it (server-side)
    res = load_results(Path(page.removeprefix("file://")).parent.parent / "results0")
    res = res.with_mce_baseline("deep_ensemble")
    columns = [c for c in leaderboard_columns(res.summary) if c.key in ("acc", "nll", "ece")]
    want = bold_rows(res.summary, res.cells, columns)
    for c in columns:
        bold = {_config(config_key(r)) for idx, r in res.summary.iterrows() if idx in want[c.key]}
        assert bold == {k for k, row in cells.items() if "best" in row[c.key]["classes"]}, c.key
    # σN-Ens τ=0.1 is 1.8 pp below the deep ensemble on every seed of digits/resnet18: told apart
    assert "best" not in cells["digits | resnet18 | sigma_ens | 4 | tau=0.1"]["acc"]["classes"]
    assert "best" in cells["digits | wrn28 | deep_ensemble | 4 | "]["acc"]["classes"]
    assert "every configuration the exact sign-flip" in driver.find_element(By.ID, "bold-rule").text

    # the failed and missing cells are listed
    problems = driver.find_elements(By.CSS_SELECTOR, "#problems tr.problem")
    status = {p.get_attribute("data-cell"): p.get_attribute("data-status") for p in problems}
    assert status.get("not-run-yet") == "missing" and "failed" in status.values()
    conventions = driver.find_element(By.ID, "conventions").text
    assert "OpenOOD v1.5" in conventions and "relative to deep_ensemble" in conventions
    assert console_problems(driver) == []
