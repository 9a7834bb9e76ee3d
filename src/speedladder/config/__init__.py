"""Configuration: a run's (`run`), each command's (`settings`), data parallelism's (`parallel`), the judge's
(`judge`), the recipe (`recipe`) and the named ladders (`ladders`); `resolved` decides every "the preset's".
The codec that turns the dataclasses into flags, data and TOML is `speedladder.codec`. Import from the module
that holds a name."""
