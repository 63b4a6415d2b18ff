"""fsdp-compat: a compatibility test harness for PyTorch FSDP2 (fully_shard) patches.

Modules in the order data flows: spec/registry (what to run) -> plan -> launch ->
worker/fsdp_run (run under torchrun) -> reference -> compare -> record -> verdict/report.
"""
