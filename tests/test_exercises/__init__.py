"""Tests that grade exercises/ or solutions/ (see tests/adapters.py)."""
