"""The engine every front end consumes: load a target and drafter, generate text, report what happened.

  engine.py   Engine: the text layer over the loop (chat template, UTF-8, stop strings) -> Chunk generator
  loader.py   EngineConfig -> Engine: the ONE way to build an engine (run, chat, serve and bench)
  stats.py    per-request statistics; outcome.py: what speculation did (mode, k); metrics.py: the JSONL log
"""
