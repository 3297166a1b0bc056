"""Data stage: embedded sets, real loaders (download=False) and the split format."""
