"""Micro-benchmarks of the model's building blocks (:mod:`.norms`: LayerNorm against
RMSNorm), which measure speed rather than a property of an init."""
