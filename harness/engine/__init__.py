"""One cell end to end: set up data and model (``cell_setup``), train (``train``), evaluate
(``evaluate``), measure its cost (``cost``), the pretrained ``single`` cell a conversion starts
from (``pretrain``), a rank's part in a multi-process cell (``distributed``; the executors start
the ranks), provenance (``environment``); :func:`harness.engine.runner.run_cell` ties them
together and writes the record through :mod:`harness.storage`."""
