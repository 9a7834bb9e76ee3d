"""Measurement: every derived figure is computed here. Warm-up and timed windows (`timer`), the compiler's counters
(`counters`), the device's queue and memory peaks (`devicemem`), peaks and MFU (`peakflops`), verdicts
(`judging`); beside them the memory probe (`memory`), the matmul ceilings (`microbench`), the race's statistics
(`stats`), compile times (`compiletime`) and what else ran on the machine (`machine_load`)."""
