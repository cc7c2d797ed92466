"""Put a loaded model's layers on devices: probe the GPU, plan with `placement`, move weights and KV.

`offload(model, num_gpu, main_gpu)` is what the loader calls. `place_layers(model, device, layers, output)`
is the device-agnostic step under it: the layers' weights go through `device.adopt_layer`, their KV cache
layers are reallocated on the device, and `model.weights.devices` (one entry per layer, then one for the
output layer) tells the arch code where each layer runs. The CPU tests use it with a second CPU device.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from . import devices, placement
from .placement import Placement

log = logging.getLogger("localrt.offload")


def offload(
    model,
    num_gpu: int,
    main_gpu: int = 0,
    *,
    probe: Callable = devices.probe,
    make_device: Callable | None = None,
    margin: int = placement.DEFAULT_MARGIN,
) -> Placement:
    """Decide and apply the GPU placement of a freshly loaded model; returns the Placement (also `model.placement`).

    num_gpu 0 never touches CUDA. Otherwise the GPU is probed; without one, auto runs on the CPU with one
    log line and an explicit num_gpu > 0 raises `placement.GPUUnavailable`.
    """
    cfg = model.config
    if model.weights.devices:
        raise ValueError("this model's layers were already placed; load it again to place them differently")
    if num_gpu == 0:
        plan = placement.cpu_only(cfg.n_layer, "num_gpu is 0: CPU only")
    elif cfg.n_expert > 0:
        # The expert kernels (per-expert views, grouped tokens) are the CPU's; the GPU backend has none yet.
        plan = placement.cpu_only(cfg.n_layer, f"{cfg.arch}: mixture-of-experts layers run on the CPU only")
        log.warning("%s", plan.reason)
    else:
        report = probe(main_gpu)
        if report.gpu is None:
            devices.log_cpu_fallback(report)
        figures = placement.figures_for(
            cfg, _tensor_bytes(model), num_ctx=model.num_ctx, num_batch=model.num_batch, n_slots=model.cache.n_slots
        )
        free = report.gpu.free_bytes if report.gpu is not None else None
        plan = placement.plan(figures, num_gpu, free, margin=margin, no_gpu_reason=report.reason)
        if plan.gpu_layers or plan.output:
            if make_device is None:
                from .backend_cuda import CUDABackend

                make_device = CUDABackend
            gpu = make_device(main_gpu)
            place_layers(model, gpu, plan.gpu_layers, plan.output)
            log.info("%s (%s, %d MiB)", plan.reason, report.gpu.name, plan.vram_bytes >> 20)
    model.placement = plan
    return plan


def place_layers(model, device, layers: Iterable[int], output: bool) -> None:
    """Run `layers` (and the output layer when `output`) on `device`: weights, KV cache and all."""
    w, cache = model.weights, model.cache
    n_layer = model.config.n_layer
    if not w.devices:
        w.devices = [model.backend] * (n_layer + 1)  # per layer, then the output layer
    for il in layers:
        if not 0 <= il < n_layer:
            raise ValueError(f"layer {il} out of range 0..{n_layer - 1}")
        w.layers[il] = device.adopt_layer(w.layers[il])
        # The host buffers are dropped, so memory is not held twice.
        cache.place_layer(il, device.zeros)  # per-slot arrays on the device, the layout its kernels read
        w.devices[il] = device
    if output:
        w.output = device.upload(w.output)  # a tied output gets its own copy; token_embd stays on the host
        w.output_norm = device.put(w.output_norm)
        w.devices[n_layer] = device


def _tensor_bytes(model) -> dict[str, int]:
    src = model._source  # the open GGUF file
    if src is None:
        return {}
    return {name: int(t.nbytes) for name, t in src.tensors.items()}
