"""Detectors: each turns records into Detections with the evidence that triggered them."""

from cgloop.analytics.detectors.base import Suppressor, make_detection
from cgloop.analytics.detectors.l4s import L4sAbuseDetector
from cgloop.analytics.detectors.overload import QueueOverloadDetector
from cgloop.analytics.detectors.slo import PLATFORM_SLOS, SloDetector, SloProfile

__all__ = [
    "PLATFORM_SLOS",
    "L4sAbuseDetector",
    "QueueOverloadDetector",
    "SloDetector",
    "SloProfile",
    "Suppressor",
    "make_detection",
]
