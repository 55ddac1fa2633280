"""How much to draft and with how many threads, from costs measured on this machine.

  controller.py   THE owner of the draft length: FixedK, Adaptive (online α per source, c, v(γ); auto-off)
  estimate.py     what one draft source has shown: decayed acceptance counts per position, its cost c
  rate.py         the closed form: E(γ), rate(γ), the best γ, v past the measured points
  threads.py      THE owner of thread counts: one chooser per phase, probes against the rounds beside them
  costs.py        THE place costs are measured: v(γ), c, step time per thread count, flash attention
  calibration.py  load-time calibration: budgeted, cached per model + machine + llama.cpp build
"""
