"""The hardware's side of a trace: FLOPs and bytes per operator, the device's peaks,
the roofline and MFU, and per-device GPU metrics. Reads a loaded trace and the peak
table (or a CPU calibration), never the rules.
"""
