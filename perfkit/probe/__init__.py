"""What a probe notebook imports: record samples, time a function, mark spans, hook a profiler.

The names a notebook needs are re-exported by `perfkit` itself (`perfkit.record`, `perfkit.bench`,
`perfkit.span`, ...); this package holds their definitions and imports nothing from the
experiment side.
"""
