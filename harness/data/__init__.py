"""Datasets: the built-in digits benchmark and the real benchmark sets (users' machines)."""
