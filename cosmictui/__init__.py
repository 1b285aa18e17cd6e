"""cosmictui: set up a blind relay for CosmicAC and watch it."""

__version__ = "0.1.0"
