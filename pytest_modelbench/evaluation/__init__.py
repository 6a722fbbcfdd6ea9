"""Evaluating one item on a worker: reuse or resume from the store, choose the endpoint (or server), run the backend."""
