"""The Run page: one run's figures, diagnosis, charts, trace and stack views and
actions. Its sections are reused where another page shows the same thing (the
diagnosis on Optimize, a trace's size guard on Compare, the attach ends on Attach)."""
