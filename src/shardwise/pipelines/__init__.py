"""The Kubeflow pipeline of the method: components.py (one per step), pipeline.py (the chain), steps.py
(what runs inside a step).

They live in the package, not only in the top-level components/ and pipelines/ folders, so that the
installed `shardwise pipeline compile|run|submit|schedule` command and the container image see the same
definitions; the top-level folders re-export them and hold the compile script and the golden YAML.
Nothing is imported here: inside a step's container kfp's pipeline-building API is absent (steps.py only).
"""
