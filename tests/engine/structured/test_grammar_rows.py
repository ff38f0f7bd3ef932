"""The runner's masks: every row's filled in one parallel call equal each matcher's own mask, a
row's drafted positions each get the mask after the drafts before it (past a refused draft: the
last one, and the matcher is rolled back), masks computed beside the forward equal those computed
after it, and a step's masks apply to any subset of its positions."""

import json

import llguidance.numpy as lnp
import numpy as np
import pytest
import torch

from bench.grammar_backends import SCHEMAS, _doc_tokens
from engine.model.registry import resolve_model
from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.structured import grammar_rows
from engine.structured.compiler import GrammarCompiler
from engine.structured.constraint import ConstraintKind, StructuredOutput
from engine.structured.grammar_rows import GrammarRows

PROMPT = 3  # prompt tokens before each row's output in token_ids


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(resolve_model("default"))


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler.for_tokenizer(tok)


def _rows(compiler, constraints, overlap=False):
    g = GrammarRows(lambda: compiler, compiler.vocab_size, overlap=overlap)
    for slot, c in enumerate(constraints):
        g.join(slot, SamplingParams(structured=c))
    return g


def _batch(outputs, width=128):
    token_ids = np.zeros((len(outputs), width), dtype=np.int64)
    for r, out in enumerate(outputs):
        token_ids[r, PROMPT : PROMPT + len(out)] = out
    return token_ids, np.full(len(outputs), PROMPT, dtype=np.int64)


def _own_mask(compiler, c, tokens):
    m = compiler.matcher(c)
    assert m.consume_tokens(tokens)
    bm = lnp.allocate_token_bitmask(1, compiler.vocab_size)
    lnp.fill_next_token_bitmask(m, bm, 0)
    return bm[0]


@pytest.mark.parametrize("threads", [1, 2])  # (one fill thread: each row's filled in turn)
@pytest.mark.parametrize("overlap", [False, True])
def test_parallel_masks_equal_each_matchers_own(tok, compiler, overlap, threads, monkeypatch):
    monkeypatch.setattr(grammar_rows, "_FILL_THREADS", threads)
    names = list(SCHEMAS) * 2
    constraints = [StructuredOutput.json_schema(SCHEMAS[n][0]) for n in names]
    docs = [_doc_tokens(tok, SCHEMAS[n][1]) for n in names]
    g = _rows(compiler, constraints, overlap)
    token_ids, prompt = _batch(docs)
    slots = np.arange(len(names))
    for step in range(min(len(d) for d in docs)):
        num_tokens = np.full(len(names), PROMPT + step)
        masks = g.start(slots, None, token_ids, num_tokens, prompt).result()
        assert list(masks.at) == list(range(len(names)))
        for r, (c, d) in enumerate(zip(constraints, docs)):
            assert np.array_equal(masks.bitmask[r], _own_mask(compiler, c, d[:step])), (names[r], step)
        probe = np.array([d[step] for d in docs])
        bits = np.unpackbits(masks.bitmask.view(np.uint8), axis=1, bitorder="little")
        assert np.array_equal(masks.allows(slots, probe), bits[slots, probe].astype(bool))
        assert masks.allows(slots, probe).all()  # (each document's next token)


def test_drafts_get_a_mask_each_and_the_matcher_rolls_back(tok, compiler):
    c = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes please", "no thanks"]), "guided_choice")
    doc = tok.encode("yes please", add_special_tokens=False)
    bad = tok.encode("no", add_special_tokens=False)[0]
    assert len(doc) >= 2 and bad != doc[1]
    g = _rows(compiler, [c])
    token_ids, prompt = _batch([[*doc[:1], doc[1], bad, doc[1]]])  # known: doc[0]; drafts: doc[1], bad, doc[1]
    num_tokens = np.array([PROMPT + 1])
    offsets = np.arange(4)
    masks = g.start(np.zeros(4, dtype=np.int64), offsets, token_ids, num_tokens, prompt).result()
    own = [_own_mask(compiler, c, doc[:1]), _own_mask(compiler, c, doc[:2])]
    assert np.array_equal(masks.bitmask[0], own[0]) and np.array_equal(masks.bitmask[1], own[0 + 1])
    assert np.array_equal(masks.bitmask[2], own[1]) and np.array_equal(masks.bitmask[3], own[1])  # past "bad"
    again = g.start(np.zeros(1, dtype=np.int64), None, token_ids, num_tokens, prompt).result()
    assert np.array_equal(again.bitmask[0], own[0])  # rolled back to the known token
    assert masks.errors == {} and again.errors == {}  # (a refused draft is no failure of the matcher)


def test_failed_matchers_are_reported_by_slot(tok, compiler):
    """A row whose matcher refuses a token it is given (a replayed one), and one whose constraint
    did not compile when it joined, are reported with their fields; each masks to EOS alone, and
    the other rows' masks are their own."""
    yes_no = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    bad = StructuredOutput(ConstraintKind.REGEX, "(a", "guided_regex")
    g = _rows(compiler, [yes_no, bad, yes_no])
    maybe = tok.encode("maybe", add_special_tokens=False)
    token_ids, prompt = _batch([maybe, [], []])
    num_tokens = np.array([PROMPT + len(maybe), PROMPT, PROMPT])
    masks = g.start(np.arange(3), None, token_ids, num_tokens, prompt).result()
    assert sorted(masks.errors) == [0, 1]
    assert masks.errors[0].param == "guided_choice" and "could not be enforced" in masks.errors[0].message
    assert masks.errors[1].param == "guided_regex" and masks.errors[1].message.startswith("guided_regex")
    eos = g._eos_mask()
    assert np.array_equal(masks.bitmask[0], eos) and np.array_equal(masks.bitmask[1], eos)
    assert np.array_equal(masks.bitmask[2], _own_mask(compiler, yes_no, []))


def test_masks_apply_to_a_subset_of_positions(compiler):
    yes_no = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    g = _rows(compiler, [yes_no, None, yes_no, None])
    token_ids, prompt = _batch([[], [], [], []])
    num_tokens = np.full(4, PROMPT)
    masks = g.start(np.arange(4), None, token_ids, num_tokens, prompt).result()
    assert list(masks.at) == [0, 2]
    logits = torch.zeros(2, compiler.vocab_size)
    out = g.apply(logits, masks, np.array([1, 2]))  # positions 1 (free) and 2 (constrained)
    assert torch.isfinite(out[0]).all()
    allowed = torch.isfinite(out[1]).nonzero().flatten().tolist()
    want = np.unpackbits(masks.bitmask[1].view(np.uint8), bitorder="little")[: compiler.vocab_size]
    assert allowed == np.flatnonzero(want).tolist() and 0 < len(allowed) < 10
    full = g.apply(torch.zeros(4, compiler.vocab_size), masks)
    assert torch.isfinite(full[[1, 3]]).all() and torch.equal(full[0], full[2])


def test_a_finished_matcher_allows_only_eos(tok, compiler):
    yes_no = StructuredOutput(ConstraintKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    g = _rows(compiler, [yes_no])
    token_ids, prompt = _batch([tok.encode("yes", add_special_tokens=False)])
    n = PROMPT + len(tok.encode("yes", add_special_tokens=False))
    masks = g.start(np.zeros(1, dtype=np.int64), None, token_ids, np.array([n]), prompt).result()
    bits = np.unpackbits(masks.bitmask[0].view(np.uint8), bitorder="little")[: compiler.vocab_size]
    assert set(np.flatnonzero(bits).tolist()) <= set(tok.eos_token_ids) and bits.any()
