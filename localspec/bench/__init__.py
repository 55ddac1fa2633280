"""`localspec bench`: does speculation pay, for these models, on this machine, for this work?

tasks.py (built-in prompts and the user's own), theory.py (the speedup formula), runner.py (interleaved plain
vs speculative runs), report.py (table, JSON, Markdown, PNG, verdict). Costs (c, v(γ)) are measured by
localspec/tuning/costs.py, the one module that measures them.
"""
