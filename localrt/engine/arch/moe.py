"""The mixture-of-experts FFN (qwen3moe, gpt-oss), computed as llama.cpp's build_moe_ffn does.

Gating "softmax" (qwen3moe): probs = softmax(ffn_gate_inp . m) over all experts; the k = expert_used_count experts
of highest prob; their probs renormalised to sum to 1 where the family says so (the sum clamped below at F16's
smallest normal, as llama.cpp). Gating "softmax_weight" (gpt-oss): logits = ffn_gate_inp . m + ffn_gate_inp.bias;
the k experts of highest logit, weighted by the softmax over those k logits.
out = sum over ranks (best first) of weight * (Wdown_e . act(Wgate_e m + bg_e, Wup_e m + bu_e) + bd_e), act SwiGLU
(silu(g) * u) or gpt-oss's clamped swiglu_oai; the expert biases (ffn_{gate,up,down}_exps.bias) only where the file
has them.

Only the selected experts' weights are read. Where the backend and format have it, every batch sorts its
(token, expert) pairs by expert and goes through `Backend.linear_grouped`: one fused call for gate and up, one for
down, each chosen expert's rows decoded once per 8 of its tokens, the activations quantized once, one flat
parallel loop over every (weight, expert, row). Otherwise a small batch (decode) goes through one fused call per
weight for all its pairs (`Backend.linear_experts`), and a larger one is grouped by expert, each group through the
per-row fused kernel over that expert's 2-D view (`Backend.linear(per_row=True)`). All compute every (token,
expert) product exactly as a one-token call does, so a token's products do not depend on how many other tokens
chose the same expert or on which path ran; each token then sums its own k results in rank order. A token's output
is therefore the same in any batch (batch invariance).
"""

from __future__ import annotations

import numpy as np

from .common import Layer

WEIGHT_SUM_MIN = np.float32(6.103515625e-5)  # llama.cpp's clamp of the top-k sum before dividing by it
# Tokens up to which the pairs go through one fused call per weight; above, grouping by expert shares each expert's
# rows among its tokens (4 per decoded block), which wins once experts get several tokens each.
PAIRS_MAX_TOKENS = 8
SORTED_CALLS = True  # `Backend.linear_grouped` where the backend and format have it (tests: off, for the others)


def route(be, cfg, L: Layer, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token of m (n_tok, n_embd): the chosen experts (n_tok, k) int64, best first, and their weights (n_tok, k) f32."""
    probs = be.linear(
        L.ffn_gate_inp, m, per_row=True
    )  # (n_tok, n_expert) router logits; per row: routing never depends on the batch
    if L.ffn_gate_inp_bias is not None:
        be.ops.add_bias(probs, L.ffn_gate_inp_bias)
    if cfg.expert_gating == "softmax_weight":  # top-k of the logits, then the softmax over those k
        chosen = np.argsort(-probs, axis=1, kind="stable")[:, : cfg.n_expert_used]  # (n_tok, k)
        weights = np.ascontiguousarray(np.take_along_axis(probs, chosen, axis=1))  # (n_tok, k) logits
        be.ops.softmax_rows(weights)
        return chosen, weights
    be.ops.softmax_rows(probs)
    # Stable sort of -p: the k largest, ties to the lower expert id.
    chosen = np.argsort(-probs, axis=1, kind="stable")[:, : cfg.n_expert_used]  # (n_tok, k)
    weights = np.take_along_axis(probs, chosen, axis=1)  # (n_tok, k)
    if cfg.expert_weights_norm:
        weights /= np.maximum(weights.sum(axis=1, keepdims=True), WEIGHT_SUM_MIN)
    return chosen, weights


def moe_ffn(be, cfg, L: Layer, m: np.ndarray) -> np.ndarray:
    """The routed experts' weighted SwiGLU FFNs for m (n_tok, n_embd) -> (n_tok, n_embd)."""
    n, k = m.shape[0], cfg.n_expert_used
    chosen, weights = route(be, cfg, L, m)
    if SORTED_CALLS and hasattr(be, "linear_grouped"):
        out = _grouped(be, cfg, L, m, chosen, weights)
        if out is not None:
            return out
    if n <= PAIRS_MAX_TOKENS and hasattr(be, "linear_experts"):
        out = _pairs(be, cfg, L, m, chosen, weights)
        if out is not None:
            return out
    per_rank = np.empty((k, n, cfg.n_embd), np.float32)  # (k, n_tok, n_embd): token t's rank-r expert output
    for e in np.unique(chosen):
        tok, rank = np.nonzero(chosen == e)  # the tokens routed to expert e, and at which rank
        x = np.ascontiguousarray(m[tok])  # (n_e, n_embd)
        gate = be.linear(L.ffn_gate_exps[e], x, per_row=True)  # (n_e, n_ff_exp)
        up = be.linear(L.ffn_up_exps[e], x, per_row=True)  # (n_e, n_ff_exp)
        if L.ffn_gate_exps_bias is not None:
            gate += L.ffn_gate_exps_bias[e]
        if L.ffn_up_exps_bias is not None:
            up += L.ffn_up_exps_bias[e]
        _act(be, cfg)(gate, up, gate)
        down = be.linear(L.ffn_down_exps[e], gate, per_row=True)  # (n_e, n_embd)
        if L.ffn_down_exps_bias is not None:
            down += L.ffn_down_exps_bias[e]
        down *= weights[tok, rank][:, None]
        per_rank[rank, tok] = down
    out = per_rank[0].copy()  # (n_tok, n_embd)
    for r in range(1, k):  # llama.cpp's order: ((e_0 + e_1) + e_2) + ...
        out += per_rank[r]
    return out


def _pairs(be, cfg, L: Layer, m: np.ndarray, chosen: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """moe_ffn's result by one fused call per expert weight over every (token, rank) pair; None where a weight's
    format has no fused experts kernel."""
    n, k, f = m.shape[0], cfg.n_expert_used, cfg.n_ff_exp
    if any(getattr(t, "stacked", None) is None for t in (L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps)):
        return None
    experts = chosen.reshape(-1).astype(np.int64)  # (n_tok * k,) pair t * k + r: token t's rank-r expert
    tokens = np.repeat(np.arange(n, dtype=np.int64), k)  # (n_tok * k,) the token of each pair
    gate = be.linear_experts(L.ffn_gate_exps.stacked, f, m, experts, tokens)  # (n_pair, n_ff_exp)
    up = be.linear_experts(L.ffn_up_exps.stacked, f, m, experts, tokens) if gate is not None else None
    if up is None:
        return None
    if L.ffn_gate_exps_bias is not None:
        gate += L.ffn_gate_exps_bias[experts]  # (n_pair, n_ff_exp) each pair's expert's bias
    if L.ffn_up_exps_bias is not None:
        up += L.ffn_up_exps_bias[experts]
    _act(be, cfg)(gate, up, gate)
    down = be.linear_experts(L.ffn_down_exps.stacked, cfg.n_embd, gate, experts, np.arange(n * k, dtype=np.int64))
    if down is None:
        return None
    if L.ffn_down_exps_bias is not None:
        down += L.ffn_down_exps_bias[experts]  # (n_pair, n_embd)
    down *= weights.reshape(-1, 1)  # (n_pair, n_embd) each pair's weighted output
    per_rank = down.reshape(n, k, cfg.n_embd)  # (n_tok, k, n_embd)
    out = per_rank[:, 0].copy()  # (n_tok, n_embd)
    for r in range(1, k):  # llama.cpp's order: ((e_0 + e_1) + e_2) + ...
        out += per_rank[:, r]
    return out


def _grouped(be, cfg, L: Layer, m: np.ndarray, chosen: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """moe_ffn's result by the (token, rank) pairs sorted by expert: one fused call for gate and up together and one
    for down, each chosen expert's rows decoded once per 8 of its tokens; None where the experts' format has no
    such kernel."""
    n, k, f = m.shape[0], cfg.n_expert_used, cfg.n_ff_exp
    if any(getattr(t, "stacked", None) is None for t in (L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps)):
        return None
    pairs = chosen.reshape(-1).astype(np.int64)  # (n_pair,) pair t * k + r: token t's rank-r expert
    order = np.argsort(pairs, kind="stable")  # (n_pair,) the pairs grouped by expert
    by_expert = pairs[order]  # (n_pair,) each sorted pair's expert
    experts, counts = np.unique(by_expert, return_counts=True)  # (n_groups,) the chosen experts, ascending
    starts = np.zeros(len(experts) + 1, np.int64)  # (n_groups + 1,) group g: sorted pairs starts[g]..starts[g+1]-1
    np.cumsum(counts, out=starts[1:])
    x = np.ascontiguousarray(m[order // k])  # (n_pair, n_embd) each sorted pair's token
    gate_up = be.linear_grouped((L.ffn_gate_exps.stacked, L.ffn_up_exps.stacked), f, x, experts, starts)
    if gate_up is None:
        return None
    gate, up = gate_up  # (n_pair, n_ff_exp) each
    if L.ffn_gate_exps_bias is not None:
        gate += L.ffn_gate_exps_bias[by_expert]
    if L.ffn_up_exps_bias is not None:
        up += L.ffn_up_exps_bias[by_expert]
    _act(be, cfg)(gate, up, gate)
    down = be.linear_grouped((L.ffn_down_exps.stacked,), cfg.n_embd, gate, experts, starts)
    if down is None:
        return None
    down = down[0]  # (n_pair, n_embd) sorted
    if L.ffn_down_exps_bias is not None:
        down += L.ffn_down_exps_bias[by_expert]
    down *= weights.reshape(-1)[order][:, None]  # each sorted pair's weighted output
    per_pair = np.empty_like(down)  # (n_pair, n_embd) back in pair order
    per_pair[order] = down
    per_rank = per_pair.reshape(n, k, cfg.n_embd)  # (n_tok, k, n_embd)
    out = per_rank[:, 0].copy()  # (n_tok, n_embd)
    for r in range(1, k):  # llama.cpp's order: ((e_0 + e_1) + e_2) + ...
        out += per_rank[:, r]
    return out


def _act(be, cfg):
    """The experts' gated activation on this device: act(gate, up, out)."""
    return be.ops.swiglu_oai if cfg.expert_act == "swiglu_oai" else be.ops.swiglu
