"""Comparing policy versions: what changed in the files, where they resolve differently, which
serving configs that affects, and the decision matrix."""
