"""Evaluating a trained Shapes DALLE: held-out losses and the checker's scores (shapes.py), split by object
and attribute (objects.py)."""
