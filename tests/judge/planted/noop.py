"""A candidate that changes nothing: the judge must revert it (noise), never keep it but by chance."""

import speedladder

speedladder.rung.define("no-op", "changes nothing", kind="speed", spec={})
