"""Environments: matrix.yaml, validated strictly, what to install for each torch version, and venvs made ready (bytecode written once, the next version fetched ahead)."""
