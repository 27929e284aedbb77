"""The shardwise pipeline (definition in src/shardwise/pipelines/pipeline.py; compiled: shardwise_pipeline.yaml)."""

from shardwise.pipelines.pipeline import build_pipeline

__all__ = ["build_pipeline"]
