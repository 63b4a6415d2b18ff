"""Results: typed records, verdicts per cell and per patch, the report's tables, Markdown/HTML/CSV, diff."""
