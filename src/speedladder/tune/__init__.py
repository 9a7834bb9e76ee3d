"""`speedladder tune`: the search over the rungs that passed, their combinations re-measured beside eager, and the
winner's commands (`search`)."""
