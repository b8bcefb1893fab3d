"""Training-dynamics tools: Markov-chain data, spectral / attention instrumentation, a stage detector."""
