"""The climb: one ladder of rungs (`ladder`), the search over them (`tune`), and the sweeps of ladders (`sweep`)."""
