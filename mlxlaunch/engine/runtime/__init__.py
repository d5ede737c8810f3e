"""engine/runtime: loading, warm-up, memory, the MLX thread, CPU attention; the only sub-room that
touches mlx-lm's private names (see `mlx_lm_internals`)."""
