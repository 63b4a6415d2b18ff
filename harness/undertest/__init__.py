"""The patches module under test: read without importing, installed per cell (noting which of its code ran), undone between patch sets."""
