"""Measuring I/O from outside the job. Knows nothing of S3 or Batch.

The job's side is `StageReporter` (profiling.protocol); the measuring happens in the sidecar
(profiling.sidecar), which emits one EMF document and one profile JSON object per stage.
"""

from profiling.metrics import METRICS, STAGES, StageProfile
from profiling.protocol import StageReporter

__all__ = ["METRICS", "STAGES", "StageProfile", "StageReporter"]
