"""Constrained decoding for `format` ("json" or a JSON schema): schema -> byte automaton -> token masks.

    check_format(fmt)                          # validate early (SchemaError = InvalidRequest -> 400)
    c = compile_format(fmt, tokenizer)         # a fresh Constraint per request; None when fmt is None or ""
    sampler = ConstrainedSampler(sampler, c)   # drop-in: masks logits, samples, advances
    # or by hand: logits = c.apply(logits); tok = sample(logits); c.advance(tok); c.done() -> EOG allowed

Pipeline: schema.py builds a byte-level NFA (grammar.py: JSON pieces; regex.py: `pattern`; numbers.py:
bounds); free-form JSON ("json", `{}`, objects/arrays without a shape) is one shared sub-automaton entered
by push edges and left by pop edges, so nesting costs a stack, not states. dfa.py determinizes it into
dense (n_states, 256) tables. vocab.py sorts each tokenizer's token bytes once (a flattened trie) and its
Numba kernel walks the automaton over it, stepping each trie edge once and pruning dead prefixes; masks
are cached per (state, stack). `format: "json"` is any JSON object at the top level, as in Ollama's
json grammar (`root ::= object`). What is generated is documented in schema.py; every finished document
validates against the schema.
"""

from __future__ import annotations

from .constraint import ConstrainedSampler, Constraint, Grammar, check_format, compile_dfa, compile_format
from .lazy import LazyConstraint
from .errors import PatternError, SchemaError, SchemaTooComplex, UnsupportedSchema
from .schema import Framed
from .vocab import TokenIndex, token_index

__all__ = [
    "ConstrainedSampler",
    "Constraint",
    "LazyConstraint",
    "Framed",
    "check_format",
    "Grammar",
    "compile_dfa",
    "compile_format",
    "PatternError",
    "SchemaError",
    "SchemaTooComplex",
    "UnsupportedSchema",
    "TokenIndex",
    "token_index",
]
