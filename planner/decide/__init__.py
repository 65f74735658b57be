"""The decisions: the Plan, distributed layouts, the per-op recipe catalogue."""
