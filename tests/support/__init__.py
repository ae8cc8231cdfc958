"""Helpers shared by test files: fakes and builders, never tests."""
