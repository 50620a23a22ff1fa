"""Benchmark suite of flwr-dp-strategies (issue 7): ``python flwr_dp_benchmarks/run.py [--quick]``.

Every benchmark reports a ratio measured in the same process against a baseline
(medians of interleaved runs); see ``flwr_dp_benchmarks/README.md``.
"""
