"""Per-rank execution under torchrun: the worker, one cell at a time under its deadline, agreeing on outcomes."""
