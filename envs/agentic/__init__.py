"""Shared pieces of the agentic environments (terminal, SWE and tool-call tasks): the sandbox."""
