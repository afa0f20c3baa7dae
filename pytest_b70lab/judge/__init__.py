"""Pure functions of evidence: the gates, their catalogue, the folder judge, replay, the teacher and its
snapshots, comparisons of two runs, the verdict. Never starts an engine."""
