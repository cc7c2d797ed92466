"""Chat templates: Go text/template (Ollama Modelfiles), Jinja (GGUF `tokenizer.chat_template`), prompt
building for generate/chat, and the choice of template in effect for a model."""
from __future__ import annotations

from .errors import TemplateError
from .gotemplate import GoTemplate, Limits

__all__ = ["GoTemplate", "Limits", "TemplateError"]
