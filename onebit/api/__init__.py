"""The OpenAI-compatible HTTP API: protocol models, routes, errors, auth, metrics."""
