"""What a trace file holds: its events as columns, and the analyses that read only them.

Loading (`load`, `columns`), the step-time breakdown (`breakdown`, `priority`,
`intervals`), kernels and operators, memory, communication, idle time, syncs and HTA's
temporal breakdown. Nothing here reads the store, the hardware tables or the rules.
"""
