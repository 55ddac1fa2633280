"""The structure drafter's forced text, spelled the way the model writes it: the grammar's whitespace choices
guessed from the answer so far, the text tokenized by the target's tokenizer (not the grammar's longest
tokens), every drafted token allowed, a unique enum prefix drafted through, and the walk kept between rounds.
Pure units over a synthetic JSON-like grammar with optional whitespace, as llama.cpp's schema grammars have."""

from __future__ import annotations

import re

import numpy as np

from localspec.sampling.constrain import Constraint, gbnf_literals
from localspec.sampling.params import SamplingParams
from localspec.speculative.drafters import PromptLookup
from localspec.speculative.structure import (
    STRUCTURE,
    StructureDrafter,
    allowed_prefix,
    forced_text,
    guess_layout,
    spell,
)

# a byte-level-ish vocabulary: single characters, BPE-like merges, and the grammar-greedy tokens a model never
# writes ('{"name', '"name"') that the old drafter picked
CHARS = [bytes([c]) for c in b'{}[]":, \n_abcdefghijklmnopqrstuvwxyz0123456789']
MERGES = [b'{"', b'":', b' "', b'",', b'"}', b'name', b'get', b'_weather', b'_time', b'city', b'\n  ', b'{"name',
          b'"name"', b'"city', b'Paris', b'Lyon']
VOCAB = [b""] + CHARS + MERGES + [b"P", b"L", b"y", b"o"]
EOG = 0
WS = object()  # optional whitespace
FREE = object()  # a string's free contents


def piece(t: int) -> bytes:
    return VOCAB[t]


_SPLIT = re.compile(rb"[a-zA-Z_]+|\n +| ?[^\sa-zA-Z_]+|\s")


def tokenize(text: str) -> list[int]:
    """A BPE-like tokenizer: the text split into words / punctuation runs (as GPT-2's pre-tokenizer does),
    each spelled by greedy longest match. It never writes '{"name': '{"' and 'name' are separate pieces."""
    out: list[int] = []
    for m in _SPLIT.finditer(text.encode()):
        w = m.group()
        while w:
            t = max((i for i, p in enumerate(VOCAB) if p and w.startswith(p) and i not in _GREEDY_ONLY),
                    key=lambda i: len(VOCAB[i]))
            out.append(t)
            w = w[len(VOCAB[t]):]
    return out


_GREEDY_ONLY = {VOCAB.index(b'{"name'), VOCAB.index(b'"name"'), VOCAB.index(b'"city')}


class Template:
    """A grammar over VOCAB: one of `forms`, each a list of literals, WS and FREE; EOG once complete."""

    def __init__(self, forms: list[list], done: bytes = b"") -> None:
        self.forms, self.done = forms, done

    def clone(self) -> "Template":
        return Template(self.forms, self.done)

    def _ok(self, text: bytes, full: bool) -> bool:
        return any(_match(f, 0, text, 0, full) for f in self.forms)

    def allows(self, token: int) -> bool:
        if token == EOG:
            return self._ok(self.done, True)
        return self._ok(self.done + VOCAB[token], False)

    def mask(self) -> np.ndarray:
        return np.array([self.allows(t) for t in range(len(VOCAB))])

    def accept(self, token: int) -> None:
        assert self.allows(token)
        self.done += VOCAB[token]

    def close(self) -> None:
        pass


def _match(form: list, i: int, text: bytes, j: int, full: bool) -> bool:
    """Does text[j:] match form[i:] (as a prefix of it unless `full`)?"""
    if j == len(text):
        return not full or all(s is WS or s is FREE for s in form[i:])
    if i == len(form):
        return False
    s = form[i]
    if s is WS or s is FREE:
        fits = text[j] in b" \n" if s is WS else text[j] != ord('"')
        return _match(form, i + 1, text, j, full) or (fits and _match(form, i, text, j + 1, full))
    n = min(len(s), len(text) - j)
    if text[j:j + n] != s[:n]:
        return False
    return _match(form, i + 1, text, j + n, full) if n == len(s) else not full


CALL = [b"{", WS, b'"name"', WS, b":", WS, b'"', FREE, b'"', WS, b",", WS, b'"city"', WS, b":", WS, b'"', FREE,
        b'"', WS, b"}"]


def text_of(tokens) -> bytes:
    return b"".join(piece(t) for t in tokens)


def test_layout_is_guessed_only_from_a_habit_of_the_answer():
    assert guess_layout(b'{"a": 1, "b": 2, "c":') == b" "  # twice a space after ':'
    assert guess_layout(b'{"a":1,"b":2,"c":') == b""
    assert guess_layout(b'{\n  "a": 1,\n  "b": 2,\n  "c": 3,') == b"\n  "
    assert guess_layout(b'{"a": 1, "b":') is None  # seen once: not yet a habit
    assert guess_layout(b'{ "a": [{"b": [{') is None  # two that differ
    assert guess_layout(b'{"a": "x", "b": "y", "c"') is None  # after a quote: a key's end, a value's start ...


def test_forced_text_walks_through_guessed_whitespace_and_stops_at_a_choice():
    g = Template([CALL])
    assert forced_text(g, piece, is_eog=lambda t: t == EOG) == b'{"name":'  # then a space or not: unknown
    g.done = b'{"name": "Paris",'
    assert forced_text(g, piece, history=b'[{"a": 1, "b": 2}, ' + g.done) == b' "city": "'
    g.done = b'{"name":"Paris",'  # a compact answer: its own style is followed
    assert forced_text(g, piece, history=b'[{"a":1,"b":2},' + g.done) == b'"city":"'
    g.done = b'{"name": "Paris", "city": "Lyon"'
    assert forced_text(g, piece, is_eog=lambda t: t == EOG, history=g.done) == b""  # ' }' or '}': unknown


def test_optional_space_hidden_in_a_chain_is_a_choice():
    """`{` and `{"` form a chain, but `{` then ` "` is allowed too: only `{` is forced."""
    space = VOCAB.index(b" ")
    g = Template([CALL])
    assert forced_text(g, piece, spaces=[space]) == b"{"
    assert forced_text(g, piece) == b'{"name":'  # without the space probe the chain is taken whole


def test_no_whitespace_is_guessed_before_free_text():
    g = Template([[b'{"a":', WS, FREE]])
    assert forced_text(g, piece, history=b'x: y') == b'{"a":'


def test_spelling_is_the_tokenizer_s_not_the_grammar_s_longest_tokens():
    toks = spell(b'{"name": "', tokenize, piece)
    assert [piece(t) for t in toks] == [b'{"', b"name", b'":', b' "']
    # after a '{' already written, the tokens the tokenizer writes for what follows it
    brace = VOCAB.index(b"{")
    assert text_of(spell(b'"name":', tokenize, piece, before=brace)) == b'"name":'


def test_an_enum_value_is_drafted_once_its_prefix_is_unique():
    two = Template([[b'{"name": "get_weather"}'], [b'{"name": "get_time"}']])
    two.done = b'{"name": "get_'
    assert forced_text(two, piece) == b""  # weather or time: a choice
    two.done = b'{"name": "get_w'
    assert forced_text(two, piece, is_eog=lambda t: t == EOG) == b'eather"}'


def drafter_params(grammar: Template) -> SamplingParams:
    return SamplingParams(constraint=Constraint(len(VOCAB), grammar=grammar, tokenize=tokenize))


def test_drafter_spells_forced_text_in_model_tokens_and_every_token_is_allowed():
    d = StructureDrafter(piece, is_eog=lambda t: t == EOG, fallback=PromptLookup())
    params = drafter_params(Template([]))
    rng = np.random.default_rng(0)
    prompt = tokenize("city names")
    params.constraint.state(prompt)  # generation starts after the prompt
    ctx = prompt + tokenize('{"name": "Paris", "city": "Lyon", "name": "Paris",')  # ', ' twice: a habit
    params.constraint.grammar.forms = [[b'{"name": "Paris", "city": "Lyon", "name": "Paris",', WS, b'"city"', WS,
                                        b":", WS, b'"', FREE, b'"}']]
    draft = d.propose(ctx, lambda s: 8, params, rng)
    assert draft.source == STRUCTURE
    assert [piece(t) for t in draft.tokens] == [b' "', b"city", b'"']  # not the grammar's '"city' + '"'
    state = params.constraint.state(ctx)
    assert allowed_prefix(state, draft.tokens, lambda t: t == EOG) == list(draft.tokens)
    assert len(d.propose(ctx, lambda s: 2, params, rng)) == 2  # never more than k


def test_the_walk_is_kept_while_the_answer_follows_it():
    walks = []

    class Counting(Template):
        def mask(self) -> np.ndarray:
            walks.append(self.done)
            return super().mask()

        def clone(self) -> "Counting":
            return Counting(self.forms, self.done)

    d = StructureDrafter(piece, is_eog=lambda t: t == EOG)
    params = drafter_params(Counting([[b'{"name":"', FREE, b'"}']]))
    rng = np.random.default_rng(0)
    prompt = tokenize("x")
    first = d.propose(prompt, lambda s: 8, params, rng)
    n = len(walks)
    second = d.propose(prompt + list(first.tokens[:2]), lambda s: 8, params, rng)  # two accepted
    assert len(walks) == n  # the rest of the forced text came from the first walk
    assert second.tokens == first.tokens[2:]


def test_inside_free_text_nothing_is_walked():
    masks = []

    class Counting(Template):
        def mask(self) -> np.ndarray:
            masks.append(self.done)
            return super().mask()

        def clone(self) -> "Counting":
            return Counting(self.forms, self.done)

    d = StructureDrafter(piece, is_eog=lambda t: t == EOG)
    params = drafter_params(Counting([[b'{"name":"', FREE, b'"}']]))
    prompt = tokenize("x")
    params.constraint.state(prompt)
    draft = d.propose(prompt + tokenize('{"name":"Pa'), lambda s: 8, params, np.random.default_rng(0))
    assert len(draft) == 0 and masks == []  # two letters allowed: free text, told by single-token checks


def test_with_the_grammar_s_literals_the_walk_needs_no_mask():
    masks = []

    class Counting(Template):
        def mask(self) -> np.ndarray:
            masks.append(self.done)
            return super().mask()

        def clone(self) -> "Counting":
            return Counting(self.forms, self.done)

    form = [b'{"name":"', FREE, b'","city":"', FREE, b'"}']
    prompt = tokenize("x")
    drafts = []
    for literals in ((), ('{', '"name"', ':', '","city":"', '"}')):
        d = StructureDrafter(piece, is_eog=lambda t: t == EOG)
        c = Constraint(len(VOCAB), grammar=Counting([form]), tokenize=tokenize, literals=literals)
        c.state(prompt)
        ctx = prompt + tokenize('{"name":"Lyon')
        drafts.append(d.propose(ctx + [VOCAB.index(b'"')], lambda s: 8, SamplingParams(constraint=c),
                                np.random.default_rng(0)).tokens)
        assert bool(masks) == (not literals)  # the literals' tokens are asked about one by one
        masks.clear()
    assert drafts[0] == drafts[1] and text_of(drafts[0]) == b',"city":"'


def test_a_lookup_draft_is_cut_where_the_grammar_forbids_it():
    d = StructureDrafter(piece, is_eog=lambda t: t == EOG, fallback=PromptLookup())
    params = drafter_params(Template([CALL]))
    rng = np.random.default_rng(0)
    prompt = tokenize('city name "Paris" is big')
    params.constraint.state(prompt)  # generation starts after the prompt
    ctx = prompt + tokenize('{"name": "Paris')
    draft = d.propose(ctx, lambda s: 8, params, rng)
    # lookup copies '" is big': the quote ends the value, a space may follow, 'is' may not (a ',' or '}' must)
    assert draft.source != STRUCTURE and text_of(draft.tokens) == b'" '


def test_a_grammar_s_literals_are_read_unescaped_and_classes_skipped():
    gbnf = 'root ::= "{" space "\\"name\\"" ":" [^"\\\\] "}"\nspace ::= " "?'
    assert gbnf_literals(gbnf) == ["{", '"name"', ":", "}", " "]
