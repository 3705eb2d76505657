"""Method plugins: one module per ensemble method, each registered in ``harness.registries.METHODS``."""
