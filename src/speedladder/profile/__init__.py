"""The profile: one step profiled in a child process (`step_profile`), its time by category (`categories`), the
rungs predicted from it (`predict`), and a miss explained by two steps profiled side by side (`explain`,
`side_by_side`, `quartiles`)."""
