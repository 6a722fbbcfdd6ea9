"""Reports people look at: HTML (own page + pytest-html), leaderboards, parquet, live progress.

Modules: ``model`` (a run's items from the store, each with its saved record),
``rows`` (per-example normalised rows, parquet/CSV), ``leaderboard`` (win
rates, leaderboard files), ``charts`` (inline SVG), ``html`` (report.html and
shared fragments), ``htmlplugin`` (pytest-html hooks), ``compare`` (paired
run comparison), ``examples`` (every example, compressed for report.html), ``changes``
(examples that changed between runs), ``view`` (``modelbench view``: the read-only local
viewer), ``live`` (progress display), ``writer`` (the plugin object).
Nothing heavy is imported here.
"""
