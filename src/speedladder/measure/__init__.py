"""Measurement: every derived figure is computed here. Warm-up and timed windows (`timer`), the compiler's counters
(`counters`), the device's queue and memory peaks (`devicemem`), FLOPs, peaks and MFU (`peakflops`), verdicts
(`judging`); beside them the memory probe (`memory`), the race's statistics (`stats`) and what the processor does
natively (`processor`).

`from speedladder import measure; measure.interleave(...)` still works, for one release: the package hands on the
names of the old measure module, and a patch of one on the package reaches the module that reads it.
"""

from speedladder.meta import hand_on

hand_on(__name__, "devicemem", "counters", "timer", "peakflops", "judging")
