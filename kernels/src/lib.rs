//! CUDA kernels for the engine (filled in by the CUDA backend work).
