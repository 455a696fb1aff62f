"""NRI's wire protocol in Python: ttrpc framing and calls, NRI's multiplexer, the plugin stub.

No ttrpc or NRI library exists for Python; this package is the plugin side of both,
bounded against hostile peers. Layers, bottom up: ``frames`` (ttrpc messages), ``mux``
(NRI's two connections over one socket), ``rpc`` (ttrpc server and client), ``events``
(subscription masks), ``stub`` (registration and event handlers). See docs/nri.md.
"""
