"""A Node-free blind relay that real hyperdht peers use as they use blind-relay-service."""

__version__ = "0.1.0"
