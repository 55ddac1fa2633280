"""Reference prompts shared by the benchmark scripts and the tests that check the same claims.

PROSE: open prose, where prompt lookup barely matches. REWRITE + REWRITE_START: a code rewrite sent the way an
editor's rewrite request is (the answer's first line already given), where the answer mostly copies the input.
"""

PROSE = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
         "Explain how a bicycle stays upright while moving."]
CODE = '''def parse_config(path):
    with open(path) as f:
        lines = f.readlines()
    result = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        result[key.strip()] = value.strip()
    return result
'''
REWRITE = f"Rename the variable `result` to `config` in this function:\n```python\n{CODE}```"
REWRITE_START = "```python\ndef parse_config(path):"
