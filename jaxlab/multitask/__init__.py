"""Multi-task learning helpers: task grouping by gradient similarity (`grouping`) and parameter exchange across
models stacked on a leading axis (`param_sharing`)."""
