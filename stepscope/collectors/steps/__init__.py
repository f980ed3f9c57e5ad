"""The step timer: where a job's steps end (an optimizer step, a forward, a generation
request, a mark), their phases, device time and samples, and the rows they go to the
store in.
"""
