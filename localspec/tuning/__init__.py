"""How much to draft and with how many threads, from costs measured on this machine.

  controller.py   THE owner of the draft length: FixedK, Adaptive (online α per source, c, v(γ); auto-off)
  trial.py        a model drafter's trial: when its acceptance is known well enough to judge
  round_cost.py   a drafted round's cost as timed: c a token, a one-token draft, a catch-up on unseen context
  verify_curve.py v(γ) as calibrated, refined by every round
  sources.py      draft sources: the γ range, a bucketed source's family, why one is off
  estimate.py     what one draft source has shown: decayed acceptance counts per position, its cost c
  acceptance.py   a model drafter's measured acceptance, kept per pair of files for the next run
  rate.py         the closed form: E(γ), rate(γ), the best γ, v past the measured points
  threads.py      THE owner of thread counts: one chooser per phase, probes against the rounds beside them
  costs.py        THE place costs are measured: v(γ), c, step time per thread count, flash attention
  calibration.py  load-time calibration: budgeted, cached per model + machine + llama.cpp build
"""
