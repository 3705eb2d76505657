"""Method plugins: ``ls methods`` is the list of methods — one module per ensemble method, each
registering exactly one method in ``harness.registry.METHODS`` (tests/methods/test_layout.py).
The machinery they share lives in private packages the registry's scan skips: ``_base`` (the
method interface), ``_sigma`` (σNorm layers, conversion, L_div: σN-Ens and FiLM-Ensemble),
``_sigma_public`` (σN-Ens on a user's own model), ``_triton`` (the σNorm kernels on CUDA) and
``_tu`` (torch-uncertainty glue)."""
