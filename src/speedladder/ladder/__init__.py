"""The climb: one ladder of rungs run as named phases (`climb`), which rungs are built upon (`builds_on`), and the
memory meters of a rung (`rung_memory`)."""
