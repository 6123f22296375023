"""`perfkit bisect`: the search over commits (search.py), each commit measured as a run in a worktree
(measure.py, worktrees.py), and the bisect's report (report.py).
"""
