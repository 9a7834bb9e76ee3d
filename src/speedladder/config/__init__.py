"""Configuration: a run's (`run`), each command's (`commands`), the named presets and ladders, and the codec that
turns the dataclasses into flags, data and TOML.

`from speedladder.config import RunConfig` still works, for one release: the package hands on `run`'s names.
"""

from speedladder.meta import hand_on

hand_on(__name__, "run", "resolved")
