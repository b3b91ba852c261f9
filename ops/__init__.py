"""The source checkout's operations tools (benchmarks, dashboards); not installed with the package.

A package so that ``paternoster bench`` imports ``ops.bench.load`` as a module (``worker/cli.py``)
instead of loading the file by its path.
"""
