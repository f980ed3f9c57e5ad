"""One experiment, fixes against a baseline: its arms and rounds (``experiment``), and
when it knows enough to stop arms or end (``adaptive`` rules, applied by ``design``).
"""
