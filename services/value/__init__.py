"""The value service (`orchard.value.v1`): scores candidate trajectories with a trained value model and reranks a
task's N candidates (best-of-N)."""
