"""A model the scheduler loaded for the service: the engine model, its batch driver and draft model, and what
building prompts needs from the store (the template, its stop strings)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import store as st

from .. import templates
from ..api.options import parse_duration
from .loading import kv_counts


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Loaded:
    """A model on a worker: the engine model plus what prompt building needs from the store."""

    name: str
    model: Any  # localrt.engine.model.Model
    record: st.ModelRecord
    template: Any  # templates.ChatTemplate
    template_stop: tuple[str, ...]
    unreported_load_ns: int = 0  # the load's duration, reported once, by the request that waited for it
    driver: Any = None  # the BatchDriver that steps this model's requests together (None: a model without KV slots)
    draft: Any = None  # the draft model loaded beside it (engine.draft_model.ModelDrafter), or None

    @property
    def size_vram(self) -> int:
        plan = getattr(self.model, "placement", None)
        return int(getattr(plan, "vram_bytes", 0) or 0)

    @property
    def slots(self) -> dict:
        """For /api/ps: the KV slots, those running a request, and the KV cache's bytes and blocks (`kv_counts`)."""
        cache = getattr(self.model, "cache", None)
        if cache is None or self.driver is None:
            return {}
        return {"slots": int(self.driver.n_slots), "slots_in_use": int(self.driver.slots_in_use), **kv_counts(cache)}

    def take_load_ns(self) -> int:
        ns, self.unreported_load_ns = self.unreported_load_ns, 0
        return ns

    def use_record(self, rec: st.ModelRecord) -> None:
        """Serve with the newest manifest of this name (create or copy may have replaced it since the load):
        its template and the template's stop strings; system, messages and params are read per request."""
        if rec.template != self.record.template:
            choice = templates.choose_template(self.model.metadata, rec.template)
            self.template, self.template_stop = choice.load(), tuple(choice.stop)
        self.record = rec

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()
        self.model.close()
        if self.draft is not None:
            self.draft.close()


def unloads(keep_alive, work) -> bool:
    """A request with nothing to do and keep_alive 0 only unloads: it never creates a built-in model."""
    return not work and keep_alive is not None and parse_duration(keep_alive) == 0
