"""Measurement: timed windows, compile counters, device memory, FLOPs and peaks, verdicts (the old `measure`
module's names, handed on for one release), and beside them the memory probe, the race's statistics and what the
processor does natively."""

from speedladder import hand_on

hand_on(__name__, "timer")
