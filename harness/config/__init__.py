"""The suite parser: YAML files and their ``include:``s (:mod:`~harness.config.includes`),
command-line ``KEY=VALUE`` overrides and ``--only`` (:mod:`~harness.config.overrides`), the
mapping parsed into the typed suite with every problem at once (:mod:`~harness.config.parse`,
``load_suite``), the suite model and its cells (:mod:`~harness.config.suite`), and the checks of
the whole suite that run before the first cell (:mod:`~harness.config.validator`)."""
