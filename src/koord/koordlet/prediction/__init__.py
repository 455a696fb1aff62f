"""koordlet's peak predictor (upstream's prediction package): per-pod, per-priority, node and
system models of CPU and memory usage in decaying histograms, checkpointed to files, and the
Prod reclaimable predictor behind NodeMetric's ``prodReclaimableMetric`` and
``prodPeakMetric``."""

from .config import PredictionConfig, add_flags
from .predictor import PredictionError, ProdReclaimablePredictor, report_problems
from .server import PeakPredictServer, PredictionUnavailable

__all__ = ["PeakPredictServer", "PredictionConfig", "PredictionError", "PredictionUnavailable",
           "ProdReclaimablePredictor", "add_flags", "report_problems"]
