"""The target's sampling distribution, as llama.cpp's sampler chain makes it, over sparse candidate rows.

  params.py     SamplingParams (a leaf)
  warp.py       warp(logits, params, history) -> Warped rows; greedy(); Warped.sample / prob
  penalties.py  repetition, presence and frequency penalties over each row's own history
  infill.py     llama.cpp's infill sampler (the editors' `top_k, top_p, infill` chain) on the candidates
  constrain.py  grammar, JSON schema and logit_bias constraints, applied to target and drafter rows alike
  logprobs.py   per-token log-probabilities for the API responses
"""
