"""The input's files and footers, and the deterministic row ranges a run is cut into."""
