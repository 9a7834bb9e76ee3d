"""Configuration: a run's (`run`), each command's (`commands`), the named presets and ladders, and the codec that
turns the dataclasses into flags, data and TOML. Import from the module that holds a name."""
