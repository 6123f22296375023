"""The engine's benchmark room: `perfkit engine bench` (`bench`: one context-decode measurement, like the
case study's bench script) and `perfkit engine benchmarks` (`headline`: the engine's headline figures,
each ratio measured side by side). It imports the model room (perfkit/engine's own modules) and the
kernels, and nothing of serving or training.
"""
