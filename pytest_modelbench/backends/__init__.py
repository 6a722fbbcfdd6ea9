"""Backends evaluate one item: built-in suites, generic JSONL data, and (as extras) verifiers / lm-eval.

``protocol`` defines what a backend is; ``registry`` maps a variant's ``module`` to one.
"""
