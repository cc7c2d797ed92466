"""Placement arithmetic on fake memory figures: num_gpu -1 / 0 / N, the output layer, the typed errors."""

from __future__ import annotations

import pytest

from localrt.errors import ModelLoadError
from localrt.engine.model import ModelConfig
from localrt.engine.backends.placement import (
    MIB,
    GPUOutOfMemory,
    GPUUnavailable,
    LayerBytes,
    MemoryFigures,
    figures_for,
    kv_layer_bytes,
    plan,
)

# 4 layers of 100 MiB weights + 20 MiB KV, a 300 MiB output layer, 50 MiB scratch
FIG = MemoryFigures(tuple(LayerBytes(100 * MIB, 20 * MIB) for _ in range(4)), 300 * MIB, 50 * MIB)
MARGIN = 10 * MIB


def _free(n_layers: int, output: bool = False, extra: int = 0) -> int:
    """Free VRAM that fits exactly n_layers (and the output) after scratch and margin."""
    return MARGIN + FIG.scratch + n_layers * 120 * MIB + (300 * MIB if output else 0) + extra


@pytest.mark.parametrize("n, output", [(0, False), (1, False), (3, False), (4, False), (4, True)])
def test_auto_takes_the_most_layers_that_fit_from_the_last(n, output):
    p = plan(FIG, -1, _free(n, output), margin=MARGIN)
    assert p.gpu_layers == tuple(range(4 - n, 4))
    assert p.output is output
    assert p.n_gpu == n + output
    assert p.vram_bytes == (0 if n == 0 else n * 120 * MIB + (300 * MIB if output else 0) + FIG.scratch)


def test_auto_one_byte_short_drops_a_layer():
    assert plan(FIG, -1, _free(3) - 1, margin=MARGIN).gpu_layers == (2, 3)
    assert plan(FIG, -1, _free(4, True) - 1, margin=MARGIN).output is False


def test_auto_puts_the_output_only_after_every_layer():
    # Room for a small output layer beside 2 layers, but layers 0-1 stay on the CPU: N = n_layer + 1 means
    # every repeating layer and then the output, as --n-gpu-layers numbers them.
    fig = MemoryFigures(FIG.layers, 5 * MIB, 0)
    p = plan(fig, -1, 250 * MIB, margin=0)
    assert p.gpu_layers == (2, 3) and p.output is False


def test_auto_without_gpu_is_cpu_with_the_reason():
    p = plan(FIG, -1, None, no_gpu_reason="CuPy is not installed")
    assert p.gpu_layers == () and not p.output and p.vram_bytes == 0
    assert "CuPy is not installed" in p.reason


def test_zero_is_cpu_even_with_a_gpu():
    p = plan(FIG, 0, 1 << 40)
    assert p.gpu_layers == () and not p.output and p.n_gpu == 0


@pytest.mark.parametrize(
    "num_gpu, layers, output",
    [
        (1, (3,), False),
        (3, (1, 2, 3), False),
        (4, (0, 1, 2, 3), False),
        (5, (0, 1, 2, 3), True),
        (999, (0, 1, 2, 3), True),
    ],
)
def test_explicit_counts_like_n_gpu_layers(num_gpu, layers, output):
    p = plan(FIG, num_gpu, 1 << 40, margin=MARGIN)
    assert p.gpu_layers == layers and p.output is output


def test_explicit_without_gpu_is_a_typed_error():
    with pytest.raises(GPUUnavailable, match="num_gpu 2 .*no GPU visible"):
        plan(FIG, 2, None, no_gpu_reason="no GPU visible")
    assert issubclass(GPUUnavailable, ModelLoadError)


def test_explicit_that_does_not_fit_is_a_typed_error():
    with pytest.raises(GPUOutOfMemory, match=r"num_gpu 4 needs 530 MiB.*only 400 MiB is free"):
        plan(FIG, 4, 400 * MIB, margin=MARGIN)
    assert plan(FIG, 3, _free(3), margin=MARGIN).gpu_layers == (1, 2, 3)


def test_bad_num_gpu():
    with pytest.raises(ModelLoadError, match="num_gpu"):
        plan(FIG, -2, 1 << 30)


def test_uneven_layers_fill_from_the_back():
    fig = MemoryFigures((LayerBytes(10, 0), LayerBytes(10, 0), LayerBytes(50, 0), LayerBytes(10, 0)), 5, 0)
    assert plan(fig, -1, 25, margin=0).gpu_layers == (3,)  # layer 2 (50) does not fit after layer 3
    assert plan(fig, -1, 60, margin=0).gpu_layers == (2, 3)
    assert plan(fig, -1, 85, margin=0).gpu_layers == (0, 1, 2, 3) and plan(fig, -1, 85, margin=0).output


def _cfg(**kw) -> ModelConfig:
    base = dict(
        arch="llama",
        n_vocab=1000,
        n_ctx_train=4096,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_head_kv=2,
        head_dim=16,
        head_dim_v=16,
        n_ff=128,
        rms_eps=1e-5,
        rope_mode=0,
        n_rot=16,
        rope_base=1e4,
        rope_freq_scale=1.0,
        rope_base_swa=1e4,
        windows=(0, 0),
        attn_scale=0.25,
        embed_scale=1.0,
        final_logit_softcap=0.0,
    )
    base.update(kw)
    return ModelConfig(**base)


def test_figures_from_tensor_sizes_and_kv():
    sizes = {
        "token_embd.weight": 1000,
        "output_norm.weight": 256,
        "blk.0.attn_q.weight": 10,
        "blk.0.ffn_up.weight": 20,
        "blk.1.attn_q.weight": 7,
        "blk.10.attn_q.weight": 99,
    }
    fig = figures_for(_cfg(windows=(0, 8)), sizes, num_ctx=64, num_batch=16, n_slots=2, tile_bytes=0)
    assert [l.weights for l in fig.layers] == [30, 7]  # blk.10 is not layer 1
    assert fig.layers[0].kv == 2 * 2 * 64 * 32 * 4  # full layer: n_ctx positions
    assert fig.layers[1].kv == 2 * 2 * 24 * 32 * 4  # sliding window: a ring of window + n_batch
    assert fig.output == 1000 + 256 + 2 * 1000 * 4  # tied output: token_embd's bytes, logits rows per slot
    assert kv_layer_bytes(1, 2, 16, 16, 100, 200, 16) == 2 * 100 * 32 * 4  # ring larger than the context
    assert fig.scratch > 16 * 4 * 64 * 4  # at least the prefill scores
