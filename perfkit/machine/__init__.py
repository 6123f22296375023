"""The machine a measurement ran on: environment snapshot, NVML, bandwidth, utilization,
roofline, instrumentation overhead and the GPU check.
"""
