"""Many chips as one: a mesh over the axes data, fsdp and tp, one partition rule per
weight, and params born sharded from their shapes (`jax.eval_shape`, no chip holds a
whole weight). Session 2 places the step on a mesh; session 4 passes weight shards
around a ring by hand (the collective matmul).

    topology.py           which device sits where in a mesh
    sharding.py           partition rules, params born sharded, batches placed
    collective_matmul.py  a matmul that overlaps its all-gather, by hand
"""
