"""The quick start's model and data (needs the ``examples`` extra: scikit-learn)."""
