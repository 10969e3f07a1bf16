"""statequery.metadata."""
