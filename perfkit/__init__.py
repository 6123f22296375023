"""perfkit: performance investigations run like experiments."""

__version__ = "0.1.0"
