"""Reports people look at: HTML (own page + pytest-html), leaderboards, parquet, live progress.

Modules: ``model`` (a run's items from session records or the store),
``rows`` (per-example normalised rows, parquet/CSV), ``leaderboard`` (win
rates, leaderboard files), ``charts`` (inline SVG), ``html`` (report.html and
shared fragments), ``htmlplugin`` (pytest-html hooks), ``compare`` (paired
run comparison), ``live`` (progress display), ``writer`` (the plugin object).
Nothing heavy is imported here.
"""
