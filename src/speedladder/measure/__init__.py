"""Measurement: every derived figure is computed here. Warm-up and timed windows (`timer`), the compiler's counters
(`counters`), the device's queue and memory peaks (`devicemem`), FLOPs, peaks and MFU (`peakflops`), verdicts
(`judging`); beside them the memory probe (`memory`), the race's statistics (`stats`), what the processor does
natively (`processor`) and what else ran on the machine (`load`)."""
