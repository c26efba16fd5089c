"""Runnable examples for llama_jev (``python -m examples.refund_policy``); importable so tests run the same code."""
