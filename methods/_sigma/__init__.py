"""σNorm machinery shared by σN-Ens and FiLM-Ensemble (not methods: nothing here registers).

``norm_base`` (the layer base, the gate), ``batchnorm`` (per-member BatchNorm; the PyTorch
specification of the fused kernels in ``methods._triton``), ``norm`` (LayerNorm/GroupNorm and
the re-exports), ``convert`` (a backbone's norm layers → σNorm), ``diversity`` (L_div, k_eff),
``norm_ensemble`` (the shared ensemble model). σN-Ens on a user's own model is
``methods/_sigma_public.py`` (beside, not inside: it reads σN-Ens's defaults from
``methods.sigma_ens``, which imports this package).
"""
