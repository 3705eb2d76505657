"""The Slurm executor (``executor``) and what it needs: cluster profiles (``profile``, reading
the YAML files of the repository's ``slurm/profiles/``), the submitit job array and the task
each array element runs (``submit``), and job/cell states for ``harness status`` (``status``).

Kept light: the Slurm task imports ``submit`` only (not submitit's executor side or the CLI).
"""
