"""Which transformer layers go on the GPU: pure arithmetic on byte figures, no device access.

Numbering follows llama.cpp's `--n-gpu-layers N`, which Ollama's `num_gpu` passes through:
- the LAST N repeating layers go on the GPU (layers `n_layer - N .. n_layer - 1`), so the hidden state
  crosses the CPU -> GPU boundary once per forward and the logits come from the GPU side;
- `N > n_layer` (Ollama counts `block_count + 1` "layers") also puts the output layer (`output_norm`,
  `output`) on the GPU;
- the token embedding (`token_embd`) always stays on the CPU: a lookup of a few rows is cheap there.

`num_gpu`: -1 = automatic (the most layers whose weights + KV cache fit in free VRAM after the scratch
and a safety margin, taken from the last layer backwards; the output layer only once every repeating layer
is placed, as N = n_layer + 1 means), 0 = CPU only, N > 0 = exactly min(N, n_layer) layers (+ the output
when N > n_layer). An explicit N that does not fit, or any N > 0 without a usable GPU, is a typed error:
never a silent CPU run or an out-of-memory crash half-way through the load.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ModelLoadError

MIB = 1 << 20
# Kept free on the GPU beyond our own estimate: the CUDA context, cuBLAS workspaces and allocator slack
# (Ollama reserves ~457 MiB per CUDA GPU for the same reasons).
DEFAULT_MARGIN = 512 * MIB
AUTO = -1


class GPUUnavailable(ModelLoadError):
    """num_gpu > 0 was asked for explicitly, but no usable GPU is present (the reason says why)."""


class GPUOutOfMemory(ModelLoadError):
    """An explicit num_gpu asks for more layers than fit in free VRAM."""


@dataclass(frozen=True)
class LayerBytes:
    """Device bytes one repeating layer needs: its raw weight blocks and its KV cache."""

    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


@dataclass(frozen=True)
class MemoryFigures:
    """Byte figures of one load: per layer, the output layer (weights + logits rows) and the GPU scratch."""

    layers: tuple[LayerBytes, ...]
    output: int
    scratch: int  # activations of one batch + the dequantization tile, needed once any layer is on the GPU


@dataclass(frozen=True)
class Placement:
    """The decision: `gpu_layers` are layer indices on the GPU (the last ones), `output` the output layer."""

    n_layer: int
    gpu_layers: tuple[int, ...]
    output: bool
    vram_bytes: int  # bytes this placement puts in GPU memory (0 when CPU only)
    reason: str  # one line: why this many layers

    @property
    def n_gpu(self) -> int:
        """The placement in llama.cpp's --n-gpu-layers numbering (n_layer + 1 = everything)."""
        return len(self.gpu_layers) + (1 if self.output else 0)

    def on_gpu(self, il: int) -> bool:
        return il in self.gpu_layers


def cpu_only(n_layer: int, reason: str) -> Placement:
    return Placement(n_layer, (), False, 0, reason)


def plan(
    figures: MemoryFigures,
    num_gpu: int,
    free_vram: int | None,
    *,
    margin: int = DEFAULT_MARGIN,
    no_gpu_reason: str = "no GPU",
) -> Placement:
    """Place layers for `num_gpu` given free VRAM in bytes (None: no usable GPU, `no_gpu_reason` says why)."""
    n_layer = len(figures.layers)
    if num_gpu < AUTO:
        raise ModelLoadError(f"num_gpu must be -1 (automatic), 0 (CPU only) or a layer count, got {num_gpu}")
    if num_gpu == 0:
        return cpu_only(n_layer, "num_gpu is 0: CPU only")
    if free_vram is None:
        if num_gpu > 0:
            raise GPUUnavailable(
                f"num_gpu {num_gpu} asks for layers on a GPU, but there is none usable: {no_gpu_reason}"
            )
        return cpu_only(n_layer, f"no usable GPU ({no_gpu_reason}): running on the CPU")
    budget = free_vram - margin - figures.scratch  # bytes left for layer weights and KV
    if num_gpu > 0:
        return _explicit(figures, num_gpu, budget, free_vram, margin)
    return _auto(figures, budget, free_vram)


def _explicit(figures: MemoryFigures, num_gpu: int, budget: int, free_vram: int, margin: int) -> Placement:
    n_layer = len(figures.layers)
    n = min(num_gpu, n_layer)
    layers = tuple(range(n_layer - n, n_layer))
    output = num_gpu > n_layer
    need = sum(figures.layers[il].total for il in layers) + (figures.output if output else 0)
    if need > budget:
        raise GPUOutOfMemory(
            f"num_gpu {num_gpu} needs {_mib(need + figures.scratch)} MiB of GPU memory (weights + KV cache + "
            f"scratch) plus a {_mib(margin)} MiB margin, but only {_mib(free_vram)} MiB is free; "
            f"use a smaller num_gpu, or -1 to pick automatically"
        )
    return Placement(
        n_layer,
        layers,
        output,
        need + figures.scratch,
        f"num_gpu {num_gpu}: {n} of {n_layer} layers" + (" and the output layer" if output else "") + " on the GPU",
    )


def _auto(figures: MemoryFigures, budget: int, free_vram: int) -> Placement:
    n_layer = len(figures.layers)
    used = 0
    first = n_layer  # layers first..n_layer-1 fit
    while first > 0 and used + figures.layers[first - 1].total <= budget:
        first -= 1
        used += figures.layers[first].total
    output = first == 0 and used + figures.output <= budget
    if output:
        used += figures.output
    layers = tuple(range(first, n_layer))
    if not layers:
        return cpu_only(
            n_layer, f"not even one layer fits in {_mib(free_vram)} MiB of free GPU memory: running on the CPU"
        )
    return Placement(
        n_layer,
        layers,
        output,
        used + figures.scratch,
        f"auto: {len(layers)} of {n_layer} layers"
        + (" and the output layer" if output else "")
        + f" fit in {_mib(free_vram)} MiB of free GPU memory",
    )


def _mib(n: int) -> int:
    return -(-n // MIB)


def kv_layer_bytes(
    n_slots: int, n_head_kv: int, head_dim: int, head_dim_v: int, n_ctx: int, window: int, n_batch: int
) -> int:
    """f32 K and V of one layer, as `kv_cache.KVCache` allocates it (a ring of window + n_batch for SWA)."""
    cap = n_ctx if window <= 0 else min(n_ctx, window + n_batch)
    return n_slots * n_head_kv * cap * (head_dim + head_dim_v) * 4


def figures_for(
    cfg, tensor_bytes: dict[str, int], *, num_ctx: int, num_batch: int, n_slots: int = 1, tile_bytes: int = 64 * MIB
) -> MemoryFigures:
    """MemoryFigures of a model: cfg is a ModelConfig, tensor_bytes maps GGUF tensor names to raw byte counts.

    The output layer is `output.weight` (or `token_embd.weight` when the file ties them: the GPU then keeps
    its own copy) plus `output_norm` and one row of logits per slot. The scratch is one batch of activations
    (residual, normed input, q/k/v, attention output, two FFN halves) plus the prefill attention scores and
    the tile a weight is dequantized into before cuBLAS multiplies it.
    """
    layers = []
    for il in range(cfg.n_layer):
        prefix = f"blk.{il}."
        w = sum(n for name, n in tensor_bytes.items() if name.startswith(prefix))
        kv = kv_layer_bytes(n_slots, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v, num_ctx, cfg.windows[il], num_batch)
        layers.append(LayerBytes(w, kv))
    out_w = tensor_bytes.get("output.weight", tensor_bytes.get("token_embd.weight", 0))
    output = out_w + tensor_bytes.get("output_norm.weight", 0) + n_slots * cfg.n_vocab * 4
    q = cfg.n_head * cfg.head_dim
    kv_w = cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
    acts = num_batch * (3 * cfg.n_embd + q + kv_w + cfg.n_head * cfg.head_dim_v + 2 * cfg.n_ff) * 4
    scores = num_batch * cfg.n_head * num_ctx * 4  # (n_tok, n_head, n_keys) f32 of one prefill chunk
    return MemoryFigures(tuple(layers), output, acts + scores + tile_bytes)
