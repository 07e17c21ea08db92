"""Tool-call tasks: the shop (tau-bench-like), BFCL's single-turn categories, and tiny learnable tasks."""
