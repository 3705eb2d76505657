"""Files a cell leaves in its folder, each written so that a crash never leaves half of it:
atomic writes and size-bounded reads (``safe_files``), records (``records``), weights and
checkpoints loaded with ``weights_only`` (``checkpoint``), the per-cell lease (``lease``) and
live progress (``progress``: ``progress.csv``, ``progress.json``, TensorBoard events; ``live``:
the working cell's heartbeat, ``live.json``)."""
