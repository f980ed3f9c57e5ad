"""From trace files to one report: every trace analysis over each rank, the ranks
analysed side by side (local processes or a Ray cluster) and merged.
"""
