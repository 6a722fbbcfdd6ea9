"""Gating: statistics, gate rules and verdicts, and where baselines come from."""
