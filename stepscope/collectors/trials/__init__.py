"""The in-job side of an experiment's trials: what a trial keeps for the optimiser to
compare (the model's outputs for the output guard) and the generation batch sweep's
prompts and batched requests.
"""
