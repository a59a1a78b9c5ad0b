"""Serving and the closed loop: score with an exported model, explore, log every decision under
a key, join the rewards that arrive later.

Registered through the ``horizon`` entry point like any third-party plugin. Scoring needs only
onnxruntime and numpy: a serving process imports neither torch nor Spark (an import-linter
contract and a test hold it to that).
"""
