"""Reproduction: one cell run locally, and exported as a standalone script that needs only torch."""
