"""What a run recorded step by step: step statistics, request latency and generation
figures, the phases of a step, one step as a timeline, ranks by node, stack samples.
"""
