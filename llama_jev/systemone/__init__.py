"""Layer 3, the System One client: the wire models, the HTTP client, the client-wide governor
and the ``Judge`` protocol every judge (remote, scripted, offline) speaks."""
