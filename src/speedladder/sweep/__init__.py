"""`speedladder sweep`: one ladder climbed at each value of an axis (batch, length, model size), the crossovers
where a rung starts or stops paying (`axis`)."""
