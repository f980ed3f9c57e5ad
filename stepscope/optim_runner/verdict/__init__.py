"""Judging an experiment's trials: each arm's ratios and guard against the baseline, the
fixes kept (``verdict``), the fixes of the fastest set that earn its gain
(``leave_one_out``; ``stacked`` reads results stored before it), gains above their
predicted bound (``bound_check``), and where each arm changed the step (``arm_changes``).
"""
