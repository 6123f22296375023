"""The one ordered list of decode-step phase names.

Every timer in the engine, every breakdown a probe records, every plot and the ledger read these
names from here, in this order, so that a phase cannot be spelled two ways.
"""

PHASES: tuple[str, ...] = (
    "draft",
    "tree_build",
    "prepare_for_verify",
    "verify_forward",
    "accept",
    "kv_commit",
)

#: The span that encloses one whole decode step; phases are measured inside it.
STEP = "step"

#: The part of a step that no phase span covers. Reported as its own bar, never given to a phase.
UNATTRIBUTED = "unattributed"

#: Everything a step breakdown shows, in display order.
BREAKDOWN: tuple[str, ...] = PHASES + (UNATTRIBUTED,)
