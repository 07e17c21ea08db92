"""Triton kernels the trainer can use instead of megatron-core's unfused torch ops on a GPU without
TransformerEngine (`trainer.fused_kernels`): RMSNorm, SwiGLU and the rotary embedding, each one kernel forward
and one backward.

Each module holds one op: its kernels, an autograd Function, and the module or function the trainer's layer spec
puts in place of the plain one. Importing them needs `triton`; on a CPU the kernels run only under Triton's
interpreter (`TRITON_INTERPRET=1`), which is how the tests compare them with the plain ops.
"""
