"""Public training stacks, as data: one entry module per stack (``STACK`` and its shims).

Each module is the patches module under test for its stack's runs (``python -m harness stacks
run``, ``nox -s stacks``); ``harness.undertest.stacks`` describes an entry. The stacks' own
code is fetched at run time (``python -m harness stacks fetch``) and never committed here.
"""
