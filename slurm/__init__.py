"""Slurm execution through submitit: cluster profiles, job arrays, status and cancellation."""
