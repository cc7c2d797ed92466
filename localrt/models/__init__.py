"""Making models: create from a Modelfile, the built-in models from PyPI packages, quantize."""
