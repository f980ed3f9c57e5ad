"""An experiment's arms and their trials: which fixes each arm applies, with which
parameters (``plan``), launching one trial (``trials``), the interleaved loop every kind of
experiment shares (``trial_loop``), failed trials (``failures``) and trials run again
because other work was busy (``repeats``, ``contention``).
"""
