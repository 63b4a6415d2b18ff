"""Environments: matrix.yaml, validated strictly, and what to install for each torch version."""
