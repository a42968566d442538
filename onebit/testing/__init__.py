"""Workshop tools, not part of serving: deterministic tiny models for tests and benchmarks, and
the GGUF exporter that hands a model to llama.cpp for the peer comparison."""
