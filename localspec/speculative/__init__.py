"""Speculative decoding itself: the loop, the verify rules, the drafters. Pure Python and numpy.

  types.py     Step, Draft, the Drafter / Controller / Target protocols, draft source names (a leaf)
  loop.py      generate(): draft γ, verify γ+1 rows in one target pass, keep what the rule accepts
  verify.py    the verify rules: greedy, same-seed, rejection sampling (pure functions of rows and an RNG)
  drafters.py  PromptLookup, ModelDrafter, HybridDrafter
  suffix.py    MatchIndex (longest earlier match) and SuffixCache (earlier requests) for prompt lookup
  reindent.py  copies at another indentation depth

Importing it does not load llama.cpp: tests drive the loop with fake models.
"""
