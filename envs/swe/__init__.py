"""The SWE environment: SWE-bench instance rows in a kernel sandbox (see README.md)."""
