"""Core: configuration, geometry, errors, dtypes and the engine protocol; imports nothing above it."""
