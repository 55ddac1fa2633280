"""`localspec bench`: does speculation pay, for these models, on this machine, for this work?

tasks.py (built-in prompts and the user's own), theory.py (the speedup formula), costs.py (measured c and
v(γ)), runner.py (interleaved plain vs speculative runs), report.py (table, JSON, Markdown, PNG, verdict).
"""
