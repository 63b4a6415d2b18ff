"""Launching: one run as a pipeline, its torchrun launches, and following each launch from outside."""
