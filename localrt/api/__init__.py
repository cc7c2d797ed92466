"""Wire types and options: a leaf that the HTTP layer, the runtime and the engine may all import."""
