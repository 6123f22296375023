"""The engine's training room: `perfkit engine train` (`train`), which makes the shipped weights in
perfkit/engine/checkpoints/ from the Python standard library's own source. It imports the model room
(perfkit/engine's own modules) and nothing of serving or benchmarks.
"""
