"""The engine: GGUF weights -> ModelConfig -> forward over a batch -> sampled tokens as events.
No HTTP, no scheduler; below it only simd_kernels, quant and gguf_io."""
