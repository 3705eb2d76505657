"""Method plugins: one module per ensemble method, registered in ``harness.registry.METHODS``."""
