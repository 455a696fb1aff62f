"""koordlet's runtime-hooks module: server, hooks framework, rule, reconciler, plugins."""
