"""Model files and names: models.toml, the hub and its cache, GGUF headers, drafter/target pairing.

Pure Python over files (no llama.cpp): the backend loads what this package finds.
"""

LOOKUP = "lookup"  # prompt lookup: a drafter choice in models.toml and on the command line, and its sources' family
