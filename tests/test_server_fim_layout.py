"""The fill-in-the-middle layout (fim.py) and llama-server's n_indent cut, with a fake tokenizer: pure, no model."""

from __future__ import annotations

import pytest

from localspec.server.request.fim import (
    CURRENT_FILE,
    REPO_NAME,
    SNIPPET_SEPARATOR,
    Extra,
    FimTokens,
    FimUnsupported,
    build_infill,
    indent_cut,
    require_fim,
)

PRE, SUF, MID, REP, SEP, BOS = 901, 902, 903, 904, 905, 1


def tok(s: str) -> list[int]:
    """A fake tokenizer: one token per character."""
    return [ord(c) for c in s]


def test_fim_tokens_from_metadata_new_and_old_keys():
    meta = {"tokenizer.ggml.fim_pre_token_id": "10", "tokenizer.ggml.fim_suf_token_id": "11",
            "tokenizer.ggml.fim_mid_token_id": "12"}
    assert FimTokens.from_metadata(meta) == FimTokens(10, 11, 12)
    old = {"tokenizer.ggml.prefix_token_id": 1, "tokenizer.ggml.suffix_token_id": 2,
           "tokenizer.ggml.middle_token_id": 3, "tokenizer.ggml.fim_sep_token_id": "-1"}
    assert FimTokens.from_metadata(old) == FimTokens(1, 2, 3)
    assert FimTokens.from_metadata({"tokenizer.ggml.fim_pre_token_id": "10"}) is None
    with pytest.raises(FimUnsupported, match="declares no FIM tokens"):
        require_fim({}, "m")


def test_psm_layout_with_prompt_and_bos():
    p = build_infill(FimTokens(PRE, SUF, MID), tok, prefix="ab", suffix="yz", prompt="c", bos=BOS, n_ctx=4096)
    assert p.tokens == [BOS, PRE, *tok("ab"), SUF, *tok("yz"), MID, *tok("c")]  # the prompt after FIM_MID
    assert not p.truncated


def test_extra_chunks_without_repo_tokens_use_snippet_separator():
    p = build_infill(FimTokens(PRE, SUF, MID), tok, prefix="p", suffix="s", extra=[Extra("X", "a.py")], n_ctx=4096)
    assert p.tokens == [*tok(SNIPPET_SEPARATOR + "X"), PRE, *tok("p"), SUF, *tok("s"), MID]


def test_repo_level_form():
    fim = FimTokens(PRE, SUF, MID, REP, SEP)
    p = build_infill(fim, tok, prefix="p", suffix="s", extra=[Extra("X", "a.py"), Extra("Y", "b.py")], n_ctx=4096)
    extra = ([REP, *tok(REPO_NAME), SEP, *tok("a.py\n"), *tok("X"), SEP, *tok("b.py\n"), *tok("Y"),
              SEP, *tok(CURRENT_FILE)])
    assert p.tokens == extra + [PRE, *tok("p"), SUF, *tok("s"), MID]


def test_budgets_keep_the_end_of_the_prefix_and_the_start_of_the_suffix():
    fim = FimTokens(PRE, SUF, MID)
    p = build_infill(fim, tok, prefix="a" * 100 + "END", suffix="START" + "b" * 100, n_ctx=64, n_batch=32)
    assert p.truncated
    body = p.tokens
    pre = body[1:body.index(SUF)]
    suf = body[body.index(SUF) + 1:-1]
    assert len(pre) == 24 and "".join(map(chr, pre)).endswith("END")
    assert len(suf) == 6 and "".join(map(chr, suf)) == "STARTb"


@pytest.mark.parametrize("text,n,cut", [
    ("x = 1\n    y = 2\n", 4, None),
    ("x = 1\n    y = 2\nz = 3", 4, 16),
    ("x = 1\n\n    y", 4, None),  # empty lines do not stop
    ("x = 1\n  ", 4, None),  # the line has no content yet
    ("x\nz", 0, None),  # n_indent 0 = off
])


def test_indent_cut(text, n, cut):
    assert indent_cut(text, n) == cut


def test_long_prefix_drops_whole_line_blocks_so_an_edit_keeps_the_start():
    fim = FimTokens(PRE, SUF, MID)
    lines = [f"line {i:03d} = value\n" for i in range(200)]
    a = build_infill(fim, tok, prefix="".join(lines), suffix="", n_ctx=4096, n_batch=2048)
    lines[190] = "line 190 = a much longer value than before\n"
    b = build_infill(fim, tok, prefix="".join(lines), suffix="", n_ctx=4096, n_batch=2048)
    assert a.truncated and b.truncated
    assert a.tokens[1:400] == b.tokens[1:400]  # same start: the cache keeps everything up to the edit
    assert "".join(map(chr, a.tokens[1:20])).startswith("line ")  # cut at a line boundary
