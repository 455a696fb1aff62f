"""The predictor's flags: upstream's names and defaults."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..flagtypes import go_duration, positive_duration

DEFAULT_CHECKPOINT_FILEPATH = "/prediction-checkpoints"


@dataclass(frozen=True)
class PredictionConfig:
    """Durations in seconds."""

    checkpoint_filepath: Path = Path(DEFAULT_CHECKPOINT_FILEPATH)
    cold_start_duration: float = 24 * 3600.0
    safety_margin_percent: int = 10
    memory_histogram_decay_half_life: float = 24 * 3600.0
    cpu_histogram_decay_half_life: float = 12 * 3600.0
    training_interval: float = 60.0
    model_expiration: float = 30 * 60.0
    model_checkpoint_interval: float = 10 * 60.0
    model_checkpoint_max_per_step: int = 12

    @property
    def safety_ratio(self) -> float:
        return (100 + self.safety_margin_percent) / 100

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PredictionConfig:
        return cls(
            checkpoint_filepath=args.prediction_checkpoint_filepath,
            cold_start_duration=args.prediction_cold_start_duration,
            safety_margin_percent=args.prediction_safety_margin_percent,
            memory_histogram_decay_half_life=args.prediction_memory_histogram_decay_halflife,
            cpu_histogram_decay_half_life=args.prediction_cpu_histogram_decay_halflife,
            training_interval=args.prediction_training_interval,
            model_expiration=args.prediction_model_expiration_duration,
            model_checkpoint_interval=args.prediction_model_checkpoint_interval,
            model_checkpoint_max_per_step=args.prediction_model_checkpoint_max_per_step)


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.isascii() and text.lstrip("-").isdigit()) or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: want an integer in {low}-{high}")
        return int(text)
    return parse


def add_flags(parser: argparse.ArgumentParser) -> None:
    d = PredictionConfig()
    g = parser.add_argument_group("peak prediction")
    g.add_argument("--prediction-checkpoint-filepath", type=Path, default=d.checkpoint_filepath,
                   metavar="DIR", help="where the models' checkpoints are kept (default %(default)s)")
    g.add_argument("--prediction-cold-start-duration", type=go_duration,
                   default=d.cold_start_duration, metavar="DURATION",
                   help="a pod younger than this counts with its request, not its prediction (default 24h)")
    g.add_argument("--prediction-safety-margin-percent", type=_bounded_int(0, 1000),
                   default=d.safety_margin_percent, metavar="PERCENT",
                   help="redundancy kept above the predicted peak (default %(default)s)")
    g.add_argument("--prediction-memory-histogram-decay-halflife", type=positive_duration,
                   default=d.memory_histogram_decay_half_life, metavar="DURATION",
                   help="memory samples lose half their weight in this time (default 24h)")
    g.add_argument("--prediction-cpu-histogram-decay-halflife", type=positive_duration,
                   default=d.cpu_histogram_decay_half_life, metavar="DURATION",
                   help="cpu samples lose half their weight in this time (default 12h)")
    g.add_argument("--prediction-training-interval", type=positive_duration,
                   default=d.training_interval, metavar="DURATION",
                   help="how often the models take the last interval's P90 (default 1m)")
    g.add_argument("--prediction-model-expiration-duration", type=positive_duration,
                   default=d.model_expiration, metavar="DURATION",
                   help="a model not trained for this long is dropped (default 30m)")
    g.add_argument("--prediction-model-checkpoint-interval", type=positive_duration,
                   default=d.model_checkpoint_interval, metavar="DURATION",
                   help="a model is checkpointed at most this often (default 10m)")
    g.add_argument("--prediction-model-checkpoint-max-per-step", type=_bounded_int(1, 100000),
                   default=d.model_checkpoint_max_per_step, metavar="N",
                   help="models checkpointed per step (default %(default)s)")
