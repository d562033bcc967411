"""The quick start's model and data (needs the ``examples`` extra: torch and scikit-learn)."""
