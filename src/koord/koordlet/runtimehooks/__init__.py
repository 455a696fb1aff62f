"""koordlet's runtime-hooks module (seed 002): server, hooks framework, rule, reconciler, plugins."""
