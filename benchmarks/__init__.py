"""shardwise's benchmarks: one harness (harness.py), experiments registered by name (experiments/), records never
overwritten (record.py, results/), and the results pages made from them (make_results.py). `python -m benchmarks
--list` lists them."""
