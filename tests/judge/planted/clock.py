"""Planted: a candidate that slows the clock. Every step looks twice as fast to a referee that reads time.perf_counter
in the candidate's process; the judge's clock is in its own process, and its guard names the patch."""

import time

import speedladder

_real = time.perf_counter
time.perf_counter = lambda: _real() * 0.5  # a clock at half speed

speedladder.rung.define("half-clock", "the same step, timed by a clock at half speed", kind="speed", spec={})
