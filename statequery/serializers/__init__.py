"""statequery.serializers."""
