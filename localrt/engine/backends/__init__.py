"""Where a layer's compute runs: the CPU backend (NumPy + Numba) and CUDA through CuPy, and layer placement."""
