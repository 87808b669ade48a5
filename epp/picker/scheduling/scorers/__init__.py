"""Scorers: one module each; every score is in [0, 1], higher is better."""
