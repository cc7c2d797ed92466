"""Modelfile parser and formatter (pure; line-numbered errors). A leaf: never imports localrt."""

from .format import build, format, format_parameters, quote
from .params import DEPRECATED, TYPES
from .parser import Command, Modelfile, ModelfileError, parse
from .request import from_create_request

__all__ = [
    "Command",
    "DEPRECATED",
    "Modelfile",
    "ModelfileError",
    "TYPES",
    "build",
    "format",
    "format_parameters",
    "from_create_request",
    "parse",
    "quote",
]
