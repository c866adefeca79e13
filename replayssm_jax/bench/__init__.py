"""Benchmarks: kernel/step timings against the copy-bandwidth roofline."""
