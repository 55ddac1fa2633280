"""Running a request's job: the one generation thread (worker.py), a job's events on the event loop (run.py),
the `timings` and `speculative` blocks of its answer (timings.py), and the counters /metrics reports (metrics.py).
"""
