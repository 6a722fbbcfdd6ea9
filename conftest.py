"""Root conftest: fixtures for ``benchmarks/`` only. The plugin itself is installed via its entry point."""
