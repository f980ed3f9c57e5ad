"""Apply fixes and compare runs (see DESIGN.md; built on the store and the analyzers)."""
