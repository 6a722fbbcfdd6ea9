"""Running one item's requests: the async loop, the OpenAI-compatible client, endpoints, progress, and metrics from journal rows."""
