"""Local fake servers that speak the platforms' and the model's protocols, for tests and benchmarks."""
