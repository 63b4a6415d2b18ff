"""Training, the single-process reference and the comparison: the recipe written once and its two sides."""
