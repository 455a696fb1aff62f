"""koord-runtime-proxy: a CRI proxy that calls runtime plugins around pod and container lifecycle calls."""
