"""Muon for the hidden matrices: a real win on d2l-cpu (1.96x sooner to the target in docs/race.md's race), a loss
on the tiny preset, where Newton-Schulz costs as much as the 32-wide matmuls it orthogonalizes (docs/judge.md)."""

import speedladder

speedladder.rung.define("try-muon", "Muon for the hidden matrices", kind="optimizer", spec={"optimizer": "muon"})
