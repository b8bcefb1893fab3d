"""A DreamerV3-style multi-task agent: `dist` (symlog, two-hot, KL balancing, lambda-returns), `nets`, `rssm` (the
world model), `behavior` (imagination actor-critic), `agent` (group world models, per-task heads, grouped sharing)
and `online` (the resumable online loop)."""
