"""`speedladder judge`: keep, revert or undecided for one candidate, raced against its base over seeds, with the
error rates said (docs/judge.md). The candidate's code runs in a worker process of its own; the clock, the data and
the evaluation stay in this one."""
