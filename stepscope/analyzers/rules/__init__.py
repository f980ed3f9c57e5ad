"""The diagnosis: a run's evidence, the readings the rules share, one rules module per
bottleneck class (each with named thresholds), the ranking of findings and the fixes
recommended for each.
"""
