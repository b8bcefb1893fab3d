"""Optimisation modelling with LLMs (OptiVer, arXiv 2605.29556): a strict model format (`ir`), solvers (HiGHS,
scipy, SCIP), structure- and solution-side verifiers (`verify`), the formulate / verify / correct loop
(`pipeline`, prompts in `prompts`), ORLM-compatible scoring (`scoring`) and benchmark loaders (`benchmarks`).
Importable without JAX; the LLM is any `jaxlab.llm.Backend`."""
