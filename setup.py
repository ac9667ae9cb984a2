"""Kept so `python setup.py ...` and tools that look for setup.py still work; everything is in pyproject.toml."""
from setuptools import setup

setup()
