"""The HTTP edge: routes, OpenAI translation, guards, access log and the daemon on a real socket."""
