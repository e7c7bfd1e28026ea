"""The server edge: KServe's ModelServer with histoserve's overrides."""
