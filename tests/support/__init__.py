"""Helpers shared by the tests: fixtures, factories and fakes (no test module imports another)."""
