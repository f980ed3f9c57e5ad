"""`stepscope run` from outside the job: the launcher, the environment and the contract it
hands the bootstrap, the job's signals and end, and the run a multi-node job's launchers
share. Nothing here runs inside the job.
"""
