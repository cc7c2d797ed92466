"""Encoder: a loaded encoder-only model (bert, nomic-bert, gemma-embedding): config, weights, tokenizer and `embed`.
No KV cache and no generation: every input runs one forward over all of its tokens, each attending to all the others
(gemma-embedding's local layers: those within its symmetric window). The runtime
sees the same face as a Model's for embeddings (tokenize, embed, num_ctx, metadata, close) and no `cache`, so no
batch driver is built for it."""

from __future__ import annotations

import numpy as np

from simd_kernels import threads

from ..errors import InvalidRequest, ModelLoadError
from . import arch as archs
from .config import ModelConfig
from .model import check_finite_output, check_ids
from .pooling import classifier_pooling, pool, pooling_type


class Encoder:
    def __init__(
        self,
        config: ModelConfig,
        metadata: dict,
        weights,
        backend,
        tokenizer,
        *,
        num_ctx: int,
        num_batch: int = 512,
        source=None,
        num_thread: int = 0,
    ) -> None:
        self.config = config
        self.metadata = metadata
        self.weights = weights
        self.backend = backend
        self.tokenizer = tokenizer
        self.num_ctx = num_ctx  # at most the trained context: positions are learned rows
        self.num_batch = num_batch
        self.num_thread = num_thread
        self.arch = archs.get(config.arch)
        self.pooling = pooling_type(metadata, config.arch)
        # a reranker's head reads the [CLS] state, or the tokens' mean (classifier.pooling_type)
        self.rank_pooling = classifier_pooling(metadata, config.arch) if self.pooling == "rank" else None
        self.load_duration_ns = 0
        self.after_first_forward = None
        self._source = source

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def finish_loading(self, wait: bool = True) -> None:
        """Nothing runs in the background after an encoder's load."""

    def hidden(self, ids) -> np.ndarray:
        """Final hidden states (len(ids), n_embd) float32 of one input (before any projection after pooling)."""
        ids = self._check_ids(ids)
        with threads.capped(self.num_thread):
            return self.arch.encode(self.backend, self.config, self.weights, ids)

    def embed_many(self, inputs: list) -> list[np.ndarray]:
        """The embedding of each input, several inputs to a forward: as many as fit num_batch tokens together (an
        input longer than that runs alone), in order."""
        out: list[np.ndarray] = []
        for hidden, lengths in self._forwards(inputs):
            pooled = np.stack([pool(h, self.pooling) for h in np.split(hidden, np.cumsum(lengths)[:-1])])
            out.extend(check_finite_output(v, "embedding values") for v in self._project(pooled))
        return out

    def _project(self, pooled: np.ndarray) -> np.ndarray:
        """pooled (n, n_embd) through the arch's projections after pooling (gemma-embedding's Dense layers), if any."""
        if not hasattr(self.arch, "project"):
            return pooled
        with threads.capped(self.num_thread):
            return self.arch.project(self.backend, self.config, self.weights, pooled)

    def rank_many(self, inputs: list, cancelled=None) -> list[float]:
        """A reranker's score of each input (a query and document's ids, runtime.rerank), batched as embed_many: the
        first output of the classification head (arch `rank`), raw, as llama-server's relevance_score. With
        `cancelled` (a threading.Event) set, it stops between forwards and returns the scores so far."""
        if self.pooling != "rank" or not hasattr(self.arch, "rank"):
            raise InvalidRequest(f"this model is not a reranker (its pooling type is {self.pooling}, not rank)")
        out: list[float] = []
        for hidden, lengths in self._forwards(inputs, cancelled):
            with threads.capped(self.num_thread):
                scores = self.arch.rank(
                    self.backend, self.config, self.weights, hidden, lengths, mean=self.rank_pooling == "mean"
                )  # (n_seq, n_cls_out)
            out.extend(float(x) for x in check_finite_output(scores[:, 0], "rerank scores"))
        return out

    def _forwards(self, inputs: list, cancelled=None):
        """(hidden (n_tok, n_embd), lengths) per forward over the inputs in order, as many to a forward as fit
        num_batch tokens together (a longer input runs alone); every input is checked before the first forward."""
        checked = [self._check_ids(ids) for ids in inputs]
        group: list[np.ndarray] = []
        for ids in checked + [None]:
            if group and (ids is None or sum(map(len, group)) + len(ids) > self.num_batch):
                if cancelled is not None and cancelled.is_set():
                    return
                lengths = [len(g) for g in group]
                with threads.capped(self.num_thread):
                    hidden = self.arch.encode(self.backend, self.config, self.weights, np.concatenate(group), lengths)
                yield hidden, lengths
                group = []
            if ids is not None:
                group.append(ids)

    def embed(self, ids) -> np.ndarray:
        """The input's embedding (n_embd,) float32, pooled as the file says (engine.pooling)."""
        return check_finite_output(self._project(pool(self.hidden(ids), self.pooling)[None])[0], "embedding values")

    def tokenize(self, text: str, special: bool = True, limit: int | None = None) -> list[int]:
        return self._tok().encode(text, add_special=True, parse_special=special, limit=limit)

    def detokenize(self, ids) -> str:
        return self._tok().decode(list(ids))

    def generate(self, *args, **kwargs):
        raise InvalidRequest(f"{self.config.arch} is an encoder: it embeds, it does not generate text")

    def _check_ids(self, ids) -> np.ndarray:
        return check_ids(ids, self.config.n_vocab, self.num_ctx)

    def _tok(self):
        if self.tokenizer is None:
            raise ModelLoadError("this model has no usable tokenizer")
        return self.tokenizer
