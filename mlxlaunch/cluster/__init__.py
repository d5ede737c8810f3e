"""Several machines, one model: hosts, the ranks `mlx.launch` starts, checks across hosts.

Built on MLX's own distributed layer (`mx.distributed`, ring or JACCL, started by `mlx.launch`)
and mlx-lm's `sharded_load`; the engine's side of it (ranks stepping in lockstep) lives in
`engine/cluster/`.
"""
