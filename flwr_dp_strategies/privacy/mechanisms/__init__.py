"""Mechanisms: each takes data and returns a :class:`~.release.Release` (output + its dp-accounting event)."""
