"""A hyper-parameter's walk from the command line to the loss, with the sweep expanded once and
the method's hyper-parameter dataclass built once on the way, carried by the cell (no memo):
``KEY=VALUE`` → suite mapping → validation → cell → model → loss, all in this process."""

from __future__ import annotations

import textwrap

import harness.config.suite as suite_module
import methods.sigma_ens as sigma_ens
from harness.config.parse import load_suite
from harness.engine.runner import run_cell

SUITE = """
name: once
grid:
  datasets: [digits]
  backbones: [{name: digits_cnn, kwargs: {width: 8}}]
  M: [2]
  seeds: [0]
  methods: [sigma_ens]
recipe: {epochs: 1, batch_size: 128}
evaluation: {cost: false}
"""


def test_tau_override_reaches_the_loss_through_one_hparams_object(
    write_suite, tmp_path, monkeypatch
):
    built: list[sigma_ens.SigmaEnsHparams] = []
    init = sigma_ens.SigmaEnsHparams.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(sigma_ens.SigmaEnsHparams, "__init__", counted)
    taus: list[float] = []
    loss = sigma_ens.diversity_loss

    def seen(net, tau, lam, layers=None):  # (model, τ, λ, layer pattern)
        taus.append(round(float(tau), 6))  # a device tensor in training, a float in diagnostics
        return loss(net, tau, lam, layers)

    monkeypatch.setattr(sigma_ens, "diversity_loss", seen)
    expansions: list[dict] = []
    expand = suite_module.expand_values

    def counted_expand(defaults, values):
        expansions.append(dict(values))
        return expand(defaults, values)

    monkeypatch.setattr(suite_module, "expand_values", counted_expand)

    suite = load_suite(
        write_suite(textwrap.dedent(SUITE)), ["grid.methods.sigma_ens.hparams.tau=0.3"]
    )
    (cell,) = suite.cells()
    assert cell.hparams["tau"] == 0.3 and cell.defaults["tau"] == 1.0  # defaults travel
    rec = run_cell(cell, tmp_path / "results", progress=False)

    assert rec["status"] == "done", rec.get("error")
    assert rec["config"]["hparams"]["tau"] == 0.3 and rec["hparams_shown"] == {"tau": 0.3}
    assert taus and set(taus) == {0.3}  # every L_div of training and its diagnostics
    assert len(built) == 1 and built[0].tau == 0.3
    assert cell.typed_hparams is built[0]  # the cell carried the one object
    assert expansions == [{"tau": 0.3}]  # the sweep expanded once: validation and cells share it
