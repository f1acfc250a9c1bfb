"""The matrix-state family: per-head n x v memories updated by a delta rule, the whole sequence
in one launch per direction, the backward recomputing from checkpoints of the state."""
