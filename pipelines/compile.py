"""Regenerate the committed golden files: pipelines/shardwise_pipeline.yaml and components/<step>.yaml.

    .venv/bin/python pipelines/compile.py

The definitions live in the package (src/shardwise/pipelines/) so that the installed `shardwise pipeline`
command and the image use the same code; tests/unit/test_pipeline_compile.py fails when these files are stale.
"""

from pathlib import Path

from shardwise.pipelines.run import compile_components, compile_pipeline

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    print(compile_pipeline(ROOT / "pipelines" / "shardwise_pipeline.yaml"))
    for path in compile_components(ROOT / "components"):
        print(path)
