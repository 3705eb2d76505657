"""The leaderboard's figures: the built-ins (:mod:`reports.figures.draw`, the reliability diagrams
in :mod:`reports.figures.reliability`) and the shared plumbing (:mod:`reports.figures.base`),
where :data:`~reports.figures.base.FIGURES` is the registry a plugin adds a figure to with
:func:`~reports.figures.base.register_figure` (docs/architecture.md, "Adding things")."""
