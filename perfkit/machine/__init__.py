"""The machine a measurement ran on: its devices (CPU model, NVML), environment snapshot,
bandwidth, utilization, roofline, instrumentation overhead and the GPU check.
"""
