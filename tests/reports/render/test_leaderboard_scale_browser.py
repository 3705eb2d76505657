"""The leaderboard at study scale in headless Chromium: 1,000 configurations stay usable.

The filters select among all rows, a page shows 100 of them, the page switch moves through the
rest, and the paired table shows only the configurations of the page.
"""

from __future__ import annotations

import pytest
from record_factory import make_record, write_records
from test_leaderboard_browser import console_problems, driver  # noqa: F401 (the fixture)

from reports.render.leaderboard import write_report

pytestmark = pytest.mark.browser

VISIBLE = """
return Array.from(document.querySelectorAll(arguments[0]))
  .filter(r => !r.hidden).map(r => r.dataset.config);
"""


@pytest.fixture(scope="module")
def big_page(tmp_path_factory):
    """1,000 configurations (2 datasets × deep ensemble + 499 σN-Ens τ values), 2 seeds each."""
    results = tmp_path_factory.mktemp(
        "scale_results"
    )  # not "results": another module reads results0
    recs = []
    for dataset in ("cifar10", "digits"):
        for seed in (0, 1):
            recs.append(make_record(dataset=dataset, seed=seed, ood_sets=(), corruption=False))
            for i in range(499):
                recs.append(
                    make_record(
                        dataset=dataset,
                        method="sigma_ens",
                        hparams={"tau": round(0.01 * (i + 1), 2)},
                        seed=seed,
                        acc=0.8 + 0.0001 * i + 0.001 * seed,
                        ood_sets=(),
                        corruption=False,
                    )
                )
    write_records(results, recs)
    html = write_report(results, tmp_path_factory.mktemp("scale_report"), figures=False)
    return html


def test_1000_configurations_page_filter_and_page_switch(driver, big_page):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    size_mb = big_page.stat().st_size / 2**20
    assert size_mb < 20, f"leaderboard.html is {size_mb:.1f} MiB"
    driver.get(big_page.as_uri())
    find = driver.find_element
    assert find(By.ID, "row-count").text == "1000 of 1000 rows"
    assert find(By.ID, "page-info").text == "page 1 of 10"
    first = driver.execute_script(VISIBLE, "#leaderboard tr.lb-row")
    assert len(first) == 100
    paired = driver.execute_script(VISIBLE, "#paired-table tr.paired-row")
    assert paired and set(paired) <= set(first)  # the paired table follows the page
    find(By.ID, "page-next").click()
    assert find(By.ID, "page-info").text == "page 2 of 10"
    second = driver.execute_script(VISIBLE, "#leaderboard tr.lb-row")
    assert len(second) == 100 and not set(second) & set(first)
    Select(find(By.ID, "filter-dataset")).select_by_visible_text("digits")
    assert find(By.ID, "row-count").text == "500 of 1000 rows"
    assert find(By.ID, "page-info").text == "page 1 of 5"  # a filter starts at its first page
    rows = driver.execute_script(VISIBLE, "#leaderboard tr.lb-row")
    assert len(rows) == 100 and all(r.startswith("digits | ") for r in rows)
    find(By.ID, "page-prev").click()  # already on the first page: stays there
    assert find(By.ID, "page-info").text == "page 1 of 5"
    assert console_problems(driver) == []
