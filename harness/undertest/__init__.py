"""The patches module under test: read without importing, installed per cell, undone between patch sets."""
