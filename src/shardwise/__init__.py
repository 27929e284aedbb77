"""shardwise: plans for sharding DLRM embedding tables, from a cost model pre-trained on real kernels."""

__version__ = "0.1.0"
