"""The Optimize page: set up an experiment from a run's fixes, follow it, read its
verdict; and the batch sweeps of inference and text-generation runs."""
