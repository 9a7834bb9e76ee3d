"""One training step: what it is made of (`train_step`: the model, the optimizer, autocast, compile), Muon (`muon`),
the learning-rate schedule and the race's length (`schedule`), and the workload every command trains on
(`workload`: the model, the corpus, the initial weights, and `measure_spec`, which times a spec beside its base)."""
