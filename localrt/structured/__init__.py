"""Constrained decoding for `format` ("json" or a JSON schema): schema -> byte automaton -> token masks.

    c = compile_format(fmt, tokenizer)        # None when fmt is None or ""
    logits = c.apply(logits); tok = sample(logits); c.advance(tok)   # each step
    c.done()                                   # EOG allowed now (the output is a complete document)
    sampler = ConstrainedSampler(sampler, c)   # or: the same as a drop-in sampler for an engine loop

Errors are `SchemaError` subclasses of `localrt.errors.InvalidRequest`.
"""
from __future__ import annotations

from .constraint import ConstrainedSampler, Constraint, Grammar, check_format, compile_dfa, compile_format
from .errors import PatternError, SchemaError, SchemaTooComplex, UnsupportedSchema
from .vocab import TokenIndex, token_index

__all__ = ["ConstrainedSampler", "Constraint", "check_format", "Grammar", "compile_dfa", "compile_format", "PatternError", "SchemaError",
           "SchemaTooComplex", "UnsupportedSchema", "TokenIndex", "token_index"]
