"""How much faster run B is than run A, and how sure: ratios of step figures with
bootstrap intervals (``stats``), throughput and median as experiments and checks compare
them (``speed``), whether the two agree (``agreement``), and latency percentiles
(``latency_compare``). Plain figures over steps: no trials, no verdicts.
"""
