"""Docker mode: the proxy in front of dockerd, serving the Docker Engine HTTP API.

``app.run`` wires it; ``server`` relays every call as it streams; ``intercept`` handles the
lifecycle calls hooks ride on; ``dockerjson`` converts Docker JSON to hook messages and
back; ``backend`` speaks HTTP/1.1 to dockerd.
"""
