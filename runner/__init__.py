"""The runner: executes a frozen schedule of benchmark cells and judges the results."""
