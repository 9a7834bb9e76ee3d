"""Is a rung the same function? One rule (`gate_rule`), read top to bottom, against eager fp32's reference
(`reference`) kept per shape by the run's `gates`; its arithmetic (`distance`, `tolerance`), what it runs a step on
(`probes`, `curves`), and its refinements, each behind a switch: `kink_census`, `flip_pricing`,
`emulated_precision`, `bisection`; a saved run's gates run again (`rerun`)."""
