"""The suite parser: YAML files and their ``include:``s (:mod:`~harness.config.includes`),
command-line ``KEY=VALUE`` overrides and ``--only`` (:mod:`~harness.config.overrides`), the
validated :class:`~harness.config.suite.Suite` and its cells (:mod:`~harness.config.suite`), and
the checks beyond parsing that run before the first cell (:mod:`~harness.config.validator`)."""
